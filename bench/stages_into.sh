#!/bin/bash
# Run prepare, tokenize and rare_terms on params.yaml with some keys changed, into a folder of
# their own (nothing under data/ or metrics/ is touched; no DVC experiment):
#
#     bench/stages_into.sh DIR key=value ...    # -> DIR/{params.yaml,prepared,tokenized,rare,*.json}
#
# e.g. bench/stages_into.sh /tmp/mp_page corpus.path=data/raw/manpages_zh.jsonl.gz corpus.language=zh \
#          corpus.reference_glossary= tokenizer.name_or_path=base/model corpus.group_field=page
# (docs/extraction.md, "Term lists and splits"). Values true / false become booleans.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1; shift
rm -rf "$dir"; mkdir -p "$dir"
cp params.yaml "$dir/params.yaml"
.venv/bin/python - "$dir/params.yaml" "$@" <<'PY'
import sys
from ruamel.yaml import YAML
yaml = YAML()
path = sys.argv[1]
data = yaml.load(open(path, encoding="utf-8"))
for item in sys.argv[2:]:
    key, value = item.split("=", 1)
    node = data
    for part in key.split(".")[:-1]:
        node = node[part]
    node[key.split(".")[-1]] = {"true": True, "false": False}.get(value, value)
yaml.dump(data, open(path, "w", encoding="utf-8"))
PY
.venv/bin/python -m stages.prepare --params "$dir/params.yaml" --out "$dir/prepared" --metrics "$dir/prepare.json"
.venv/bin/python -m stages.tokenize --params "$dir/params.yaml" --prepared "$dir/prepared" \
    --out "$dir/tokenized" --metrics "$dir/tokenize.json"
.venv/bin/python -m stages.rare_terms --params "$dir/params.yaml" --prepared "$dir/prepared" \
    --tokenized "$dir/tokenized" --out "$dir/rare" --metrics "$dir/rare_terms.json"
