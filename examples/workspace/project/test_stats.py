# Prints TAP: the reward reads the named results, not the exit status.
from stats import mean, spread

cases = [
    ("mean of 1..4", lambda: mean([1, 2, 3, 4]), 2.5),
    ("mean of one", lambda: mean([7]), 7),
    ("spread", lambda: spread([3, 9, 4]), 6),
]
print("1..%d" % len(cases))
bad = 0
for i, c in enumerate(cases):
    got = c[1]()
    if got == c[2]:
        print("ok %d - %s" % (i + 1, c[0]))
    else:
        bad += 1
        print("not ok %d - %s # got %r, want %r" % (i + 1, c[0], got, c[2]))
if bad:
    raise SystemExit(1)
