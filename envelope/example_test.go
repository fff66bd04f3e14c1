package envelope_test

import (
	"errors"
	"fmt"

	"github.com/promptline/promptline/envelope"
)

func ExampleDecode() {
	key := []byte("sess-42")
	value := []byte(`{"message_id":"msg-1","session_id":"sess-42","text":"Summarise the last three commits."}`)

	p, err := envelope.Decode(key, value, envelope.Limits{})
	if err != nil {
		panic(err)
	}
	fmt.Println(p.MessageID, p.SessionID, p.Delivery, p.Resumes())
	fmt.Println(p.Text)

	// A rejection says why, in a reason that goes to the rejects topic.
	_, err = envelope.Decode([]byte("sess-7"), value, envelope.Limits{})
	var rej *envelope.RejectError
	if errors.As(err, &rej) {
		fmt.Println(rej.Reason)
	}
	_, err = envelope.Decode(nil, []byte(`{"message_id":"msg-2","session_id":"sess-42","text":"","priority":1}`), envelope.Limits{})
	fmt.Println(err)

	// Output:
	// msg-1 sess-42 queue true
	// Summarise the last three commits.
	// key_mismatch
	// unknown_field: unknown field "priority"
}

func ExampleMarshal() {
	resume := false
	b, err := envelope.Marshal(envelope.Prompt{
		MessageID: "msg-3",
		SessionID: "sess-42",
		Text:      "Actually, stop after the tests.",
		Delivery:  envelope.DeliverySteer,
		Resume:    &resume,
	})
	if err != nil {
		panic(err)
	}
	// Publish b with Kafka key "sess-42".
	fmt.Println(string(b))

	// Defaults are left out.
	b, _ = envelope.Marshal(envelope.Prompt{MessageID: "msg-4", SessionID: "sess-42", Text: "Go on."})
	fmt.Println(string(b))

	// Output:
	// {"message_id":"msg-3","session_id":"sess-42","text":"Actually, stop after the tests.","delivery":"steer","resume":false}
	// {"message_id":"msg-4","session_id":"sess-42","text":"Go on."}
}
