package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// One environment (or config file) serves every command, and `topic` is
// a setting of send: the prompts topic (here its default, so that the
// test broker has it). reply's --topic (the permission
// replies topic) and watch's (the events topic) name other topics, so
// they are read from the command line only: a shared PROMPTLINE_TOPIC
// set for send must not send a reply into the prompts topic, where
// admission rejects it and the parked session never resumes.
func TestSharedTopicSettingIsSends(t *testing.T) {
	t.Parallel()
	addr := testkit.Broker(t, 4).Addr()
	env := []string{"PROMPTLINE_BROKERS=" + addr, "PROMPTLINE_TOPIC=prompts"}

	res := runCLIEnv(t.Context(), env, "send", "--session", "s-1", "--text", "hi")
	require.NoError(t, res.err, res.stderr)
	require.Regexp(t, `^prompts/`, res.stdout, "send takes the shared setting")

	res = runCLIEnv(t.Context(), env, "reply", "--session", "s-1", "--request", "r-1", "once")
	require.NoError(t, res.err, res.stderr)
	require.Regexp(t, `^permission-replies/`, res.stdout, "reply publishes to the replies topic")
	require.Len(t, testkit.ReadAll(t, addr, "prompts"), 1, "the prompt alone")

	res = runCLIEnv(t.Context(), env, "reply", "--session", "s-1", "--request", "r-2", "once", "--topic", "wakes")
	require.NoError(t, res.err, res.stderr)
	require.Regexp(t, `^wakes/`, res.stdout, "the command line still names it")

	res = runCLIEnv(t.Context(), env, "watch", "--from-beginning", "--count", "1", "--timeout", "3s", "--json")
	require.Error(t, res.err, "watch read the prompts topic: %s", res.stdout)
	require.Empty(t, res.stdout, "watch printed a prompt as an event")
}
