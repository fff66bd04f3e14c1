package pipeline_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// A prompt is admitted only when the transaction that produced it
// committed: one of an aborted transaction never ran for its producer, and
// must not run here either.
func TestTransactionalPrompts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	cfg := kafkautil.NewConfig("txn-producer")
	cfg.Producer.Transaction.ID = "txn-" + t.Name()
	producer, err := sarama.NewSyncProducer(b.brokers, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, producer.Close()) })

	sess := "txn-session"
	inTxn := func(p envelope.Prompt, commit bool) {
		t.Helper()
		v, err := envelope.Marshal(p)
		require.NoError(t, err)
		require.NoError(t, producer.BeginTxn())
		_, _, err = producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(sess), Value: sarama.ByteEncoder(v)})
		require.NoError(t, err)
		if commit {
			require.NoError(t, producer.CommitTxn())
		} else {
			require.NoError(t, producer.AbortTxn())
		}
	}
	inTxn(envelope.Prompt{MessageID: "aborted", SessionID: sess, Text: "never sent"}, false)
	inTxn(envelope.Prompt{MessageID: "committed", SessionID: sess, Text: "sent"}, true)
	b.send(t, envelope.Prompt{MessageID: "after", SessionID: sess, Text: "plain"})

	require.Equal(t, "echo: sent", b.waitTurn(t, "committed").Text)
	b.waitTurn(t, "after")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = 'aborted'`), "a prompt of an aborted transaction is never admitted")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM inputs`))
}
