package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
)

// Send a prompt and wait for its answer. The Watcher is created first: it
// starts at the newest offsets, so the answer cannot slip past it.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := &client.Config{Brokers: []string{env.brokers}}
	session := unique("example")

	w, err := client.NewWatcher(cfg, &client.WatchOpts{SessionID: session})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	p, err := client.NewProducer(cfg)
	if err != nil {
		panic(err)
	}
	defer p.Close()

	id := client.NewMessageID()
	if _, _, err := p.Send(ctx, envelope.Prompt{MessageID: id, SessionID: session, Text: "hello"}); err != nil {
		panic(err)
	}
	turn, err := w.WaitTurn(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(turn.Type, turn.Text)
	// Output: turn.completed echo: hello
}

// Answer a permission request: the consumer runs with
// --tool-permission echo=ask, so a turn that calls the echo tool parks its
// session and publishes permission.asked until a reply arrives.
func ExampleProducer_Reply() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := &client.Config{Brokers: []string{env.brokers}}
	session := unique("example-reply")

	w, err := client.NewWatcher(cfg, &client.WatchOpts{SessionID: session,
		Types: []string{envelope.EventPermissionAsked, envelope.EventTurnCompleted, envelope.EventTurnFailed}})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	p, err := client.NewProducer(cfg)
	if err != nil {
		panic(err)
	}
	defer p.Close()

	id := client.NewMessageID()
	if _, _, err := p.Send(ctx, envelope.Prompt{MessageID: id, SessionID: session, Text: `/tool echo {"text":"hi"}`}); err != nil {
		panic(err)
	}
	asked, err := w.Next(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(asked.Type, asked.Tool, string(asked.Input))
	if _, _, err := p.Reply(ctx, session, asked.RequestID, envelope.ReplyOnce, ""); err != nil {
		panic(err)
	}
	turn, err := w.WaitTurn(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(turn.Type, turn.Text)
	// Output:
	// permission.asked echo {"text":"hi"}
	// turn.completed tool results: echo: hi
}
