#!/bin/bash
cat > /app/wordfreq.py <<'PY'
"""Print the most frequent words of a text file."""

import re
import sys
from collections import Counter


def top_words(text, n=3):
    counts = Counter(re.findall(r"[a-z']+", text.lower()))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def main():
    with open(sys.argv[1]) as f:
        for word, count in top_words(f.read()):
            print(word, count)


if __name__ == "__main__":
    main()
PY
