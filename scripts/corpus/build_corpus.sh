#!/usr/bin/env bash
# Rebuild the tokenizer corpus in this folder from Debian packages (see docs/TOKENIZER.md).
#
#   sudo scripts/corpus/build_corpus.sh      # needs apt (installs r-cran-janeaustenr and R)
#
# Run once by hand; the outputs are committed, and training (scripts/train_tokenizer.py) and the
# tests read only them. Every text is public domain: Jane Austen's six novels (1811-1818, from
# r-cran-janeaustenr, whose packaging is MIT), The Jargon File 4.4.7 (dict-jargon; placed in the
# public domain by its editors) and Ambrose Bierce's The Devil's Dictionary (1911, dict-devil).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

apt-get install -y -qq --no-install-recommends r-cran-janeaustenr >/dev/null
(cd "$work" && apt-get download -qq dict-jargon dict-devil 2>/dev/null)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/x"; done

mkdir -p "$here/train" "$here/heldout"
# janeaustenr keeps each novel as a character vector, one element per line of the text.
Rscript -e '
  out <- commandArgs(TRUE)[1]
  books <- c(sensesensibility = "train/austen-sense-and-sensibility.txt",
             prideprejudice = "train/austen-pride-and-prejudice.txt",
             mansfieldpark = "train/austen-mansfield-park.txt",
             emma = "train/austen-emma.txt",
             northangerabbey = "train/austen-northanger-abbey.txt",
             persuasion = "heldout/austen-persuasion.txt")
  for (b in names(books)) {
    e <- new.env()
    data(list = b, package = "janeaustenr", envir = e)
    writeLines(e[[b]], file.path(out, books[[b]]), useBytes = TRUE)
  }' "$here"

# A dictd database is a gzip'd text plus an index of (headword, offset, length) in base64;
# the body is every entry but the "00-database-*" metadata (headers, licence notice, URLs).
python3 - "$work/x/usr/share/dictd" "$here" <<'PY'
import gzip, sys
from pathlib import Path
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
def num(s):
    n = 0
    for c in s:
        n = n * 64 + B64.index(c)
    return n
src, out = Path(sys.argv[1]), Path(sys.argv[2])
for name, dest in [("jargon", "train/jargon-file.txt"), ("devil", "heldout/devils-dictionary.txt")]:
    data = gzip.open(src / f"{name}.dict.dz").read()
    spans = []
    for line in (src / f"{name}.index").read_text(encoding="utf-8").splitlines():
        word, off, length = line.split("\t")
        if not word.startswith("00"):
            spans.append((num(off), num(off) + num(length)))
    body = data[min(s for s, _ in spans):max(e for _, e in spans)]
    (out / dest).write_bytes(body)
PY

(cd "$here" && sha256sum train/*.txt heldout/*.txt > SHA256SUMS)  # of the texts, not the .xz
xz -9e -f -T1 "$here"/train/*.txt
dpkg-query -W -f='${Package} ${Version}\n' r-cran-janeaustenr >"$here/PACKAGES"
for deb in "$work"/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' ' | sed 's/^Package: //; s/ Version: / /' >>"$here/PACKAGES"; done
cat "$here/PACKAGES" "$here/SHA256SUMS"
