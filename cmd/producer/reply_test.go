package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

var replyLine = regexp.MustCompile(`^permission-replies/(\d+)/(\d+) request_id=(\S+) reply=(\S+)\n$`)

// TestReply: producer reply publishes the reply admission expects, key =
// session ID on the session's murmur2 partition, and refuses a bad one
// before connecting, naming the flag. (End to end against a consumer: the
// client package's ExampleProducer_Reply.)
func TestReply(t *testing.T) {
	t.Parallel()

	const partitions = 4
	setup := func(t *testing.T) string {
		t.Helper()
		return testkit.Broker(t, partitions).Addr()
	}

	t.Run("Publishes", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		for _, tc := range []struct {
			session string
			args    []string
			want    envelope.PermissionReply
		}{
			{"s-1", []string{"--request", "r-1", "once"}, envelope.PermissionReply{RequestID: "r-1", Reply: envelope.ReplyOnce}},
			{"21", []string{"always", "--request", "r-2"}, envelope.PermissionReply{RequestID: "r-2", Reply: envelope.ReplyAlways}},
			{"s-3", []string{"--request", "r-3", "reject", "--message", "use the staging database"},
				envelope.PermissionReply{RequestID: "r-3", Reply: envelope.ReplyReject, Message: "use the staging database"}},
			{"s-4", []string{"--request", "r-4", "reject"}, envelope.PermissionReply{RequestID: "r-4", Reply: envelope.ReplyReject}},
		} {
			res := runCLI(t.Context(), "", append([]string{"reply", "--brokers", addr, "--session", tc.session}, tc.args...)...)
			require.NoError(t, res.err, res.stderr)
			m := replyLine.FindStringSubmatch(res.stdout)
			require.NotNil(t, m, "reply printed %q", res.stdout)
			require.Equal(t, []string{tc.want.RequestID, tc.want.Reply}, m[3:])
			partition, err := strconv.ParseInt(m[1], 10, 32)
			require.NoError(t, err)
			offset, err := strconv.ParseInt(m[2], 10, 64)
			require.NoError(t, err)
			require.Equal(t, kafkautil.Murmur2Partition([]byte(tc.session), partitions), int32(partition), "session %s", tc.session)

			found := false
			for _, rec := range testkit.ReadAll(t, addr, "permission-replies") {
				if rec.Partition != int32(partition) || rec.Offset != offset {
					continue
				}
				found = true
				require.Equal(t, tc.session, string(rec.Key))
				r, err := envelope.DecodeReply(rec.Value, envelope.Limits{})
				require.NoError(t, err, "%s", rec.Value)
				require.Equal(t, tc.want, r)
			}
			require.True(t, found, "no record at permission-replies/%d/%d", partition, offset)
		}
	})

	t.Run("Topic", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)
		res := runCLI(t.Context(), "", "reply", "--brokers", addr, "--topic", "prompts", "--session", "s-1", "--request", "r-1", "once")
		require.NoError(t, res.err, res.stderr)
		require.True(t, strings.HasPrefix(res.stdout, "prompts/"), res.stdout)
		require.Len(t, testkit.ReadAll(t, addr, "prompts"), 1)
	})

	t.Run("FlagErrors", func(t *testing.T) {
		t.Parallel()
		// Validation comes before any connection: the default broker
		// address is never dialled.
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--request", "r", "once"}, "--session is required"},
			{[]string{"--session", "s", "once"}, "--request is required"},
			{[]string{"--session", "s", "--request", "r"}, "want one reply, once, always or reject; got 0 arguments"},
			{[]string{"--session", "s", "--request", "r", "once", "always"}, "got 2 arguments"},
			{[]string{"--session", "s", "--request", "r", "yes"}, `reply: want once, always or reject, got "yes"`},
			{[]string{"--session", "s", "--request", "r", "once", "--message", "m"}, "--message goes only with reject, not with once"},
			{[]string{"--session", "s", "--request", "a b", "once"}, "--request: invalid_field: request_id"},
			// The session is the record's key, which admission checks
			// against the request's session: a key no session can have
			// would only come back as a reject.
			{[]string{"--session", "a b", "--request", "r", "once"}, "--session: invalid_field: session_id has a non-printable or non-ASCII character at byte 1"},
			{[]string{"--session", strings.Repeat("s", 129), "--request", "r", "once"}, "--session: invalid_field: session_id must be 1 to 128 characters, got 129"},
			{[]string{"--session", "s", "--request", "r", "reject", "--message", "a\x00b"}, "--message: invalid_field: message must not contain U+0000"},
			{[]string{"--session", "s", "--request", "r", "--topic", "", "once"}, "--topic: must not be empty"},
			// json.Marshal would send U+FFFD in its place: the model would
			// get a message the operator never wrote.
			{[]string{"--brokers", "127.0.0.1:1", "--session", "s", "--request", "r", "reject", "--message", "caf\xe9"}, "--message: invalid_utf8"},
		} {
			res := runCLI(t.Context(), "", append([]string{"reply"}, tc.args...)...)
			require.ErrorContains(t, res.err, tc.want, fmt.Sprint(tc.args))
			require.Empty(t, res.stdout)
		}
	})
}
