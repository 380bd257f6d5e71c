#!/usr/bin/env bash
# The BERT family at equal pretraining compute: pretrain eight members of the 6 x 512 model,
# fine-tune each on GLUE (5 tasks), SQuAD v1.1 and CoNLL-2003 with 3 seeds, report the claims.
# Settings: experiments/variants.py (models, steps from FLOPs) and bench/variants.py (the
# budget, fine-tuning recipe, job order). Results: docs/variants.md.
#
#   scripts/variants_compare.sh cpu-prep DATA_ROOT     # tensorflow machine: ~8 min on 2 cores
#   scripts/variants_compare.sh gpu [--cells C]        # GPU: run until it says "complete"
#   scripts/variants_compare.sh report RECORDS         # anywhere: docs/variants.{md,png}
#
# DATA_ROOT holds pretrain-corpus/, glue/, conll2003/ and squad/squad-v1.1-dev-part-a.json
# (required). cpu-prep writes variants_data/ (~40 MiB; carry it to the GPU
# machine). gpu stops by itself before VARIANTS_DEADLINE_S (default 560) seconds so that it
# fits a 10-minute slot; run it again on the same machine and it continues (pretraining from
# its Orbax checkpoints, fine-tuning from the runs already finished). It writes
# $OUT/variants_h200.jsonl (the records) and $OUT/logs.txt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  cpu-prep)
    [ "$#" -eq 2 ] || { echo "usage: $0 cpu-prep DATA_ROOT" >&2; exit 2; }
    root="$2"
    python -m bench variants prepare --corpus "$root/pretrain-corpus" --glue "$root/glue" \
      --conll "$root/conll2003" --squad "$root/squad/squad-v1.1-dev-part-a.json" \
      --out variants_data --work variants_work ;;
  gpu)
    # GPU machines without ml_collections: the wheel carried in .whl/
    if ! python -c "import ml_collections" 2>/dev/null; then
      python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$here"/.whl/*.whl
      export PYTHONPATH="$PYTHONPATH:/tmp/site"
    fi
    shift
    PYTHONUNBUFFERED=1 python -m bench variants gpu --data variants_data --work variants_gpu \
      --out "${OUT:-variants_out}" --deadline-s "${VARIANTS_DEADLINE_S:-560}" "$@" ;;
  report)
    [ "$#" -eq 2 ] || { echo "usage: $0 report RECORDS" >&2; exit 2; }
    python -m bench variants report "$2" --docs "$here/docs" ;;
  *) echo "usage: $0 cpu-prep DATA_ROOT | gpu | report RECORDS" >&2; exit 2 ;;
esac
