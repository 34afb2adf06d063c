#!/bin/sh
# Fetch the real corpora headwise trains on, without installing anything (no R needed):
#   r-cran-janeaustenr  Jane Austen's six novels (R lazy-load data, read with the `rdata` package)
#   trans-de-en         the Ding German-English dictionary (usr/share/trans/de-en)
# Each Debian package is downloaded with `apt-get download` and unpacked with `dpkg-deb -x`
# into corpora/<name>/. Usage: scripts/fetch-corpora.sh [DEST]   (default: ./corpora)
set -eu
dest=${1:-corpora}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetch() {  # fetch PACKAGE FOLDER
    if [ -d "$dest/$2" ]; then echo "corpora: $2 already in $dest/$2"; return; fi
    # stale package lists on a fresh machine: refresh them once (needs root), then retry
    (cd "$work" && apt-get download "$1" >/dev/null 2>&1) ||
    { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null 2>&1 &&
      (cd "$work" && apt-get download "$1" >/dev/null 2>&1); } || {
        echo "corpora: 'apt-get download $1' failed; run 'apt-get update' (needs a Debian/Ubuntu apt source)" >&2
        exit 1
    }
    mkdir -p "$work/$2"
    dpkg-deb -x "$work"/"$1"_*.deb "$work/$2"
    mv "$work/$2" "$dest/$2"
    echo "corpora: $1 -> $dest/$2"
}
fetch r-cran-janeaustenr janeaustenr
fetch trans-de-en trans-de-en
