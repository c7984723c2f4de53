package agent_test

import (
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
)

func TestTheSandboxSeesThePinnedEnvironmentAndTheTrajectoryRecordsIt(t *testing.T) {
	task := loadTask(t, `{"id": "pins", "prompt": "p", "sandbox": {"backend": "wasm", "env": {"LANG": "de_DE.UTF-8"}},
	 "reward": {"type": "exact", "answer": "x"}}`)
	tr := runEpisode(t, task, &turnsPolicy{turns: []agent.Turn{
		calls("bash", `{"command": "echo $TZ $PYTHONHASHSEED $SOURCE_DATE_EPOCH $LANG; hostname"}`),
		calls("finish", `{"answer": "x"}`),
	}})
	want := map[string]string{"seed": "0", "episode_id": "ep", "hostname": agent.PinnedHostname,
		"env.TZ": "UTC", "env.PYTHONHASHSEED": "0", "env.SOURCE_DATE_EPOCH": agent.PinnedEnv["SOURCE_DATE_EPOCH"]}
	for k, v := range want {
		if tr.Pinned[k] != v {
			t.Errorf("pinned[%q] = %q, want %q (all: %v)", k, tr.Pinned[k], v, tr.Pinned)
		}
	}
	if _, ok := tr.Pinned["env.LANG"]; ok {
		t.Errorf("the task's own LANG was pinned over: %v", tr.Pinned)
	}
	got := toolSteps(tr)[0].Output
	if !strings.HasPrefix(got, "UTC 0 1704067200 de_DE.UTF-8\nsandbox\n") {
		t.Errorf("the sandbox saw %q", got)
	}
}

func TestARecordedPinnedMapIsUsedAsIs(t *testing.T) {
	recorded := map[string]string{"seed": "7", "episode_id": "old", "env.TZ": "Europe/Paris"}
	tr := runEpisode(t, loadTask(t, `{"id": "pins", "prompt": "p", "reward": {"type": "exact", "answer": "x"}}`),
		&turnsPolicy{turns: []agent.Turn{calls("bash", `{"command": "echo tz=$TZ hs=$PYTHONHASHSEED"}`)}},
		func(c *agent.Config) { c.Pinned = recorded })
	if len(tr.Pinned) != len(recorded) || tr.Pinned["env.TZ"] != "Europe/Paris" {
		t.Errorf("pinned = %v, want %v", tr.Pinned, recorded)
	}
	if got := toolSteps(tr)[0].Output; !strings.HasPrefix(got, "tz=Europe/Paris hs=\n") {
		t.Errorf("the sandbox saw %q", got)
	}
}
