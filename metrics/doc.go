// Package metrics defines promptline's Prometheus metrics and serves them.
// It is fed from outside and imports nothing of promptline's: the pipeline
// and the relay take a *Metrics (nil-safe) and count into it.
//
// Every metric, its labels and meaning (a public contract; keep the README
// in step):
//
//	promptline_admissions_total{outcome,reason}   prompts classified by admission: outcome admitted | duplicate | conflict | rejected (reason: the rejects header)
//	promptline_admission_batch_size               histogram of prompts per admission transaction
//	promptline_admission_seconds                  histogram of admission transaction latency
//	promptline_turns_total{outcome}               turns finished: completed | failed
//	promptline_turn_seconds                       histogram of promotion-to-answer latency
//	promptline_active_executions                  sessions executing in this process now
//	promptline_outbox_published_total             outbox rows published by this process's relay
//	promptline_wakes_total{result}                wakes consumed: started | coalesced | invalid
//	promptline_claims_total{event}                claim events: acquired | renewed | released | lost
//	promptline_fenced_writes_total                execution writes refused by the fence: a sign of split ownership
//	promptline_recovery_decisions_total{decision} recovery decisions: cleared | superseded | rewoken | continued | reconciled | quarantined
//	promptline_redriven_wakes_total               sessions re-woken because their wake was lost
//	promptline_quarantined_rows{kind}             quarantined rows (claim | input), from the database, refreshed every recovery pass
//
// Plus the Go runtime and process collectors (go_*, process_*).
package metrics
