package taskimport

import (
	"fmt"
	"strings"
	"testing"
)

func TestPatchFilesListsWhatADiffTouches(t *testing.T) {
	diff := `diff --git a/tests/test_a.py b/tests/test_a.py
--- a/tests/test_a.py
+++ b/tests/test_a.py
@@ -1 +1,2 @@
 x
+y
diff --git a/tests/new_test.py b/tests/new_test.py
new file mode 100644
--- /dev/null
+++ b/tests/new_test.py
@@ -0,0 +1 @@
+z
diff --git a/tests/old.py b/tests/old.py
deleted file mode 100644
--- a/tests/old.py
+++ /dev/null
@@ -1 +0,0 @@
-gone
diff --git a/tests/from.py b/tests/to.py
similarity index 100%
rename from tests/from.py
rename to tests/to.py
diff --git a/tests/data.bin b/tests/data.bin
Binary files a/tests/data.bin and b/tests/data.bin differ
diff --git a/tests/link.py b/tests/link.py
new file mode 120000
--- /dev/null
+++ b/tests/link.py
@@ -0,0 +1 @@
+/etc/passwd
\ No newline at end of file
`
	got := fmt.Sprint(patchFiles(diff))
	want := "[{tests/test_a.py tests/test_a.py false false false} {tests/new_test.py tests/new_test.py false false false} {tests/old.py tests/old.py true false false} " +
		"{tests/to.py tests/from.py false false false} {tests/data.bin tests/data.bin false true false} {tests/link.py tests/link.py false false true}]"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestNamesBecomeTaskIDsAndImageTags(t *testing.T) {
	for _, tc := range []struct{ name, id, repo string }{
		{"fix-wordfreq", "fix-wordfreq", "fix-wordfreq"},
		{"django__django-11099", "django__django-11099", "django-django-11099"},
		{"org/Task Name!", "org-Task-Name-", "org-task-name"},
		{"__weird", "weird", "weird"},
	} {
		r := &Result{}
		id := taskID(r, "name", tc.name)
		if id != tc.id || repoComponent(id) != tc.repo {
			t.Errorf("%q: id %q, repo %q; want %q, %q", tc.name, id, repoComponent(id), tc.id, tc.repo)
		}
		if (id != tc.name) != (len(r.Problems) == 1) {
			t.Errorf("%q: a changed name is noted: %+v", tc.name, r.Problems)
		}
	}
}

func TestHarborSizes(t *testing.T) {
	for in, want := range map[string]int{"2G": 2048, "512M": 512, "1.5g": 1536, "2048K": 2} {
		if got, err := sizeMB(in); err != nil || got != want {
			t.Errorf("%s: %d %v, want %d", in, got, err, want)
		}
	}
	if _, err := sizeMB("lots"); err == nil || !strings.Contains(err.Error(), "not a size") {
		t.Errorf("lots: %v", err)
	}
}

func TestNetworkUseInATestScriptIsFound(t *testing.T) {
	script := "apt-get update && apt-get install -y curl\ncurl -LsSf https://astral.sh/uv/install.sh | sh\nuvx pytest /tests\npython3 -m pytest\n"
	got := dedupe(networkRe.FindAllString(script, -1))
	if fmt.Sprint(got) != "[apt-get install curl uvx]" {
		t.Errorf("found %v", got)
	}
	if m := networkRe.FindAllString("cd /app && python3 -m pytest -q /tests/test_outputs.py", -1); len(m) != 0 {
		t.Errorf("false alarm: %v", m)
	}
}

func TestBaseImagesOfADockerfile(t *testing.T) {
	df := "ARG V=3\nFROM --platform=linux/amd64 rollbox/python:latest AS build\nRUN x\nfrom build AS again\nFROM scratch\nFROM python:${V}\nFROM rollbox/base\n"
	images, unresolved := baseImages(df)
	if fmt.Sprint(images) != "[rollbox/python:latest rollbox/base]" || fmt.Sprint(unresolved) != "[python:${V}]" {
		t.Errorf("images %v, unresolved %v", images, unresolved)
	}
}
