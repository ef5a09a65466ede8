#!/usr/bin/env bash
# Makes the packed-documents corpus of configs/packed-demo.yaml from the fortune files that
# Debian's fortunes and fortunes-min packages ship (/usr/share/games/fortunes: strfile text,
# one short document between "%" lines, about 2.7 MB in 44 files):
#   1. a SentencePiece model (unigram, vocab_size 1024) trained on the training files,
#   2. train.h5 and eval.h5: the documents tokenized with it, with their doc_starts.
# The files `fortunes` and `wisdom` are held out for evaluation; every other file trains.
# Usage: bash scripts/make-packed-corpus.sh [OUT_DIR]   (default runs/corpus/fortunes)
# Installs missing packages (scripts/install-deps.sh) and builds iha-data if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/corpus/fortunes}
vocab=${IHA_CORPUS_VOCAB:-1024}
bash scripts/install-deps.sh
src=/usr/share/games/fortunes
iha_data=build/apps/iha-data/iha-data
if [ ! -x "$iha_data" ]; then
  [ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j "${IHA_JOBS:-$(nproc)}" --target iha-data
fi
held_out=("$src/fortunes" "$src/wisdom")
train=()
for f in "$src"/*; do
  # strfile's index (.dat) and the UTF-8 links (.u8) are not text of their own.
  case "$f" in *.dat | *.u8) continue ;; esac
  [ -f "$f" ] || continue
  case " ${held_out[*]} " in *" $f "*) continue ;; esac
  train+=("$f")
done
[ ${#train[@]} -gt 0 ] || { echo "make-packed-corpus: no fortune files in $src" >&2; exit 2; }
mkdir -p "$out"
sep=%  # a line holding only "%" ends a fortune
"$iha_data" spm-train "${train[@]}" "$out/spm" --vocab-size "$vocab" --separator "$sep"
"$iha_data" text "${train[@]}" "$out/train.h5" --separator "$sep" --spm "$out/spm.model"
"$iha_data" text "${held_out[@]}" "$out/eval.h5" --separator "$sep" --spm "$out/spm.model"
"$iha_data" info "$out/train.h5" --seq-len 128
"$iha_data" info "$out/eval.h5" --seq-len 128
