"""The `datastore` stage: kNN-LM's memory of the trained model over the train split (`stage`; see
stages/datastore.py and docs/knn.md). The store's arrays, how they are built and searched, and the
mix at decode time are in rarelm/knn/; this package sits above both rarelm/knn/ and
rarelm/evaluate/ (it loads the model as evaluate does), which rarelm/knn/ cannot: evaluate imports it.
"""
