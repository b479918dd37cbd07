"""`python -m rarelm.tracking ui-url [TRACKING_URI]`: the MLflow UI's link to the runs (`make ui`)."""

import sys

from rarelm.tracking.ui import main

sys.exit(main(sys.argv[1:]))
