// Package replay reads a range of a prompts topic (or of the rejects
// topic) again and runs every message through admission: operators replay
// topics in batch after a bug fix, to rebuild a database from the topic, or
// to re-admit rejected messages after a limit change.
//
// Replay never joins the live consumer group and commits no offset: it
// reads each partition with a plain Sarama partition consumer between
// offsets resolved at start (docs/design.md: on kfake a standalone offset
// manager for a group that never joined cannot commit anyway). Its
// progress lives in the Report and, across interruptions, in a resume
// file written by the caller.
//
// Invariants:
//
//  1. Every message is decoded with envelope.Decode and admitted through
//     admission.Admitter, batched: each one is admitted, a duplicate, a
//     conflict or malformed, and never admitted twice (P2).
//  2. A message ID already in inputs is classified by a read-only query
//     (admission.ReadStored) with admission's own rule, admission.Classify
//     (a prompt with the same envelope.Prompt.Hash: duplicate; another
//     hash or another kind of input: conflict), and does not reach the
//     Admitter unless it would arm a wake. Rows of inputs are never deleted and their hash
//     never changes, so that classification is final; an ID not found goes
//     through Admit, which settles races with a concurrent live consumer.
//  3. Without Config.Wake, prompts are admitted with resume=false: no wake
//     is armed, nothing is executed. An exact retry with resume=true
//     (a later replay with Wake, or the producer) arms them.
//  4. A partition's next offset moves only after its batch is durable, so
//     an interrupted replay resumed from Report offsets, together with the
//     first run, classifies every message of the range exactly as one
//     uninterrupted run would.
//  5. DryRun writes nothing: it classifies with the same read-only query
//     and remembers, for the whole run, the IDs it would admit.
package replay
