package main

import (
	"strings"
	"testing"
)

// TestCPFlags: train refuses --cp by name (numeric CP ranks are not
// built); simulate prints every factor of a contradiction; a method not
// modelled is refused by name.
func TestCPFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--model", "tiny", "--gpus", "2", "--cp", "2", "--seq", "16", "--lbs", "1", "--steps", "1"},
			"--cp = 2: context parallelism is priced by simulate/plan; numeric CP ranks are not built yet"},
		{[]string{"simulate", "--model", "llama3-8b", "--gpus", "64", "--cp", "3", "--seq", "8192", "--lbs", "1"},
			"gpus = 64 is not divisible by dp_replicate × cp × tp = 1 × 3 × 1 = 3"},
		{[]string{"simulate", "--model", "llama3-8b", "--gpus", "8", "--cp", "2", "--cp-method", "a2a", "--seq", "8192", "--lbs", "1"},
			"cp_method = a2a"},
	} {
		_, err := runCmd(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error containing %q", c.args, err, c.want)
		}
	}
}
