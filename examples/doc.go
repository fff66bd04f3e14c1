// Package examples holds producers of prompt envelopes written in other
// languages, as docs/producers.md shows them, and the tests that run them
// against the embedded broker: node/ publishes with kafkajs.
package examples
