package replay

import "testing"

// The outputs of pytest, go test, time(1) in its forms and other test
// runners, recorded and replayed with other wall-clock durations, match
// once durations are masked; a change in what they report does not.
func TestDurationMaskingCoversTheCommonFormsAndNothingElse(t *testing.T) {
	same := []struct{ what, recorded, replayed string }{
		{"pytest's summary", "===== 5 passed in 0.02s =====", "===== 5 passed in 0.31s ====="},
		{"pytest over a minute", "===== 5 passed in 62.30s (0:01:02) =====", "===== 5 passed in 59.10s ====="},
		{"pytest over an hour", "== 1 failed, 2 passed in 3723.01s (1:02:03) ==", "== 1 failed, 2 passed in 3599.99s (0:59:59) =="},
		{"pytest's old summary", "=== 3 passed in 0.12 seconds ===", "=== 3 passed in 1.5 seconds ==="},
		{"pytest --durations", "0.50s call     test_x.py::test_a\n0.01s setup    test_x.py::test_a", "1.20s call     test_x.py::test_a\n0.00s setup    test_x.py::test_a"},
		{"go test's package line", "ok  \tgithub.com/x/y\t0.123s", "ok  \tgithub.com/x/y\t1.5s"},
		{"go test's cached package line", "ok  \tgithub.com/x/y\t0.123s\tcoverage: 80.0% of statements", "ok  \tgithub.com/x/y\t(cached)\tcoverage: 80.0% of statements"},
		{"go test -v", "--- PASS: TestX (0.00s)\n--- FAIL: TestY (1.25s)\nFAIL\tpkg\t1.3s", "--- PASS: TestX (0.01s)\n--- FAIL: TestY (0.98s)\nFAIL\tpkg\t1.0s"},
		{"go test's timeout", "panic: test timed out after 10m0s\n\trunning tests:\n\t\tTestX (10m0s)", "panic: test timed out after 10m0s\n\trunning tests:\n\t\tTestX (9m59.5s)"},
		{"go's durations", "took 1h2m3.5s, then 1.5µs and 12ms", "took 59m58s, then 800ns and 3ms"},
		{"bash's time", "real\t0m0.010s\nuser\t0m0.002s\nsys\t0m0.000s", "real\t1m2.110s\nuser\t0m0.902s\nsys\t0m0.100s"},
		{"time -p (POSIX)", "real 0.01\nuser 0.00\nsys 0.00", "real 12.51\nuser 3.20\nsys 0.11"},
		{"busybox time", "real\t0m 0.00s\nuser\t0m 0.00s\nsys\t0m 0.00s", "real\t1m 2.31s\nuser\t0m 0.50s\nsys\t0m 0.02s"},
		{"GNU time", "0.00user 0.00system 0:00.00elapsed 0%CPU (0avgtext+0avgdata 1536maxresident)k",
			"1.52user 0.10system 1:02.31elapsed 97%CPU (0avgtext+0avgdata 1536maxresident)k"},
		{"GNU time -v", "\tUser time (seconds): 0.00\n\tSystem time (seconds): 0.00\n\tPercent of CPU this job got: 0%\n\tElapsed (wall clock) time (h:mm:ss or m:ss): 0:00.00",
			"\tUser time (seconds): 1.52\n\tSystem time (seconds): 0.10\n\tPercent of CPU this job got: 97%\n\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02.31"},
		{"zsh's time", "python t.py  0.02s user 0.01s system 92% cpu 0.031 total", "python t.py  1.02s user 0.11s system 99% cpu 1.131 total"},
		{"unittest", "Ran 3 tests in 0.001s\n\nOK", "Ran 3 tests in 0.250s\n\nOK"},
		{"jest and mocha", "Time:        1.234 s\n  ✓ adds (12ms)", "Time:        0.9 s\n  ✓ adds (3ms)"},
		{"cargo test", "test result: ok. 1 passed; 0 failed; finished in 0.00s", "test result: ok. 1 passed; 0 failed; finished in 0.31s"},
		{"timeit", "2000000 loops, best of 5: 46.4 nsec per loop", "2000000 loops, best of 5: 120 usec per loop"},
		{"a time of day", "started at 12:34:56.789", "started at 09:00:01.002"},
		{"minutes", "done in 2 minutes", "done in 1 minute"},
	}
	for _, c := range same {
		if a, b := maskDurations(c.recorded), maskDurations(c.replayed); a != b {
			t.Errorf("%s: masked differently:\n%q\n%q", c.what, a, b)
		}
	}
	differ := []struct{ what, recorded, replayed string }{
		{"pytest's counts", "===== 5 passed in 0.02s =====", "===== 4 passed, 1 failed in 0.02s ====="},
		{"go test's verdict", "ok  \tgithub.com/x/y\t0.123s", "FAIL\tgithub.com/x/y\t0.123s"},
		{"go test's package", "ok  \tgithub.com/x/y\t(cached)", "ok  \tgithub.com/x/z\t(cached)"},
		{"a test's verdict", "--- PASS: TestX (0.00s)", "--- FAIL: TestX (0.00s)"},
		{"coverage", "coverage: 80.0% of statements", "coverage: 75.0% of statements"},
		{"a number", "answer: 42", "answer: 43"},
		{"a version", "Python 3.12.1", "Python 3.11.9"},
		{"a ratio", "ratio 1:23", "ratio 1:24"},
		{"a count of items", "collected 3 items", "collected 4 items"},
		{"maxresident", "(0avgtext+0avgdata 1536maxresident)k", "(0avgtext+0avgdata 9999maxresident)k"},
		{"a word after real", "real value 0.5 of 1", "real value 0.6 of 1"},
	}
	for _, c := range differ {
		if a, b := maskDurations(c.recorded), maskDurations(c.replayed); a == b {
			t.Errorf("%s: a real difference was masked: %q and %q both became %q", c.what, c.recorded, c.replayed, a)
		}
	}
}
