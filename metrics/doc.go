// Package metrics defines promptline's Prometheus metrics and serves them.
// It is fed from outside and imports nothing of promptline's: admission,
// the executor, the Kafka handler, the ledger, the relay and recovery
// report what happens through OnXxxFunc callbacks, which the consumer's
// run wires to these collectors.
//
// Every metric, its labels and meaning (a public contract; keep the README
// in step):
//
//	promptline_admissions_total{outcome,reason}   prompts classified by admission, each counted once: outcome admitted | duplicate | conflict (its reject is not counted again as rejected) | rejected (reason: the rejects header; rejected permission replies are counted here too) | reject_unpublished (a reject too large for the rejects topic even without its value, or one the broker refuses for good, INVALID_RECORD, as a compacted rejects topic refuses a keyless reject: logged, dropped; the original stays in its topic)
//	promptline_admission_batch_size               histogram of prompts per admission transaction
//	promptline_admission_seconds                  histogram of admission transaction latency
//	promptline_turns_total{outcome}               turns finished: completed | failed
//	promptline_turn_seconds                       histogram of promotion-to-answer latency
//	promptline_active_executions                  sessions executing in this process now
//	promptline_outbox_published_total             outbox rows published by this process's relay
//	promptline_outbox_pruned_total                published outbox rows deleted by this process once older than --outbox-retention
//	promptline_ledger_pruned_total{table}         ledger rows deleted by this process once their execution was settled, its session idle, and older than --ledger-retention, by table: attempts | tool_calls (rows recovery may still need are never deleted)
//	promptline_wakes_total{result}                wakes consumed: started | coalesced | invalid | local (a wake from Kafka whose prompt already ran from a local wake: executor/local_wakes.go)
//	promptline_claims_total{event}                claim events: acquired | renewed | released | lost
//	promptline_fenced_writes_total                execution writes refused by the fence: a sign of split ownership
//	promptline_execution_write_retries_total      execution writes (a provider's answer, a tool's result, a failed turn, a deferred attempt, a permission ask) retried after a transient database error while their lease lived; a write whose commit's answer was lost is detected, never applied twice
//	promptline_recovery_decisions_total{decision} recovery decisions: cleared | superseded | rewoken | continued | reconciled | quarantined
//	promptline_recovery_held{decision}            what a held recovery pass (--recovery-mode hold, or `consumer recovery hold`) planned and left for an operator, by decision (the claims' decisions, and redriven for lost wakes), every one that waits: at most ten pages of --recovery-batch claims are decided per pass, a longer backlog over several passes (the gauge then shows the last whole count); 0 in auto
//	promptline_recovery_transient_errors_total    recovery decisions that failed with a transient database error (lost connection, lock or statement timeout, deadlock, serialization failure): the claim is left as it was for the next pass, never quarantined
//	promptline_recovery_capped_total              expired claims quarantined with reason recovery_cap instead of being continued or re-woken: their session's turn had been run again by recovery --recovery-max-per-session times within --recovery-max-per-session-window (also counted in promptline_recovery_decisions_total{decision="quarantined"})
//	promptline_recovery_deferred_total{kind}      expired claims (kind claim) and lost wakes (kind wake) an automatic recovery pass left for the next one for want of a --recovery-rate token (the fleet's bucket gave none within one --recovery-interval); they stay as they were, nothing is skipped for good
//	promptline_redriven_wakes_total               sessions re-woken because their wake was lost
//	promptline_quarantined_rows{kind}             quarantined rows (claim | input | outbox), from the database, refreshed every recovery pass
//	promptline_outbox_publish_delay_seconds       histogram, per published batch: the age of its oldest row when marked published (commit-to-publish latency, upper bound), of the rows whose created_at is a time
//	promptline_wake_to_start_seconds              histogram of the latency from a wake's at to the executor starting (or joining) the session's run
//	promptline_provider_attempts_total{outcome}   provider requests sent, by outcome: succeeded | failed | unknown (may have been acted on)
//	promptline_provider_attempt_seconds{outcome}  histogram of one provider request's latency
//	promptline_provider_attempts_unknown_total{provider,model} provider attempts that became unknown (they may have been billed): counted by the executor when it records one unknown (a dropped connection, a shutdown mid-request) and by recovery when a committed decision marks one unknown (reconciled after a crash, or sent again with its idempotency key); model is "" when the provider names none
//	promptline_provider_tokens_at_risk{provider,model} gauge: the sum of the estimated input tokens (a request's JSON bytes / 4, recorded with its intent) of the attempts in state unknown, neither resolved by an operator (`consumer session resolve`) nor pruned (--ledger-retention); read from the database (partial index attempts_unknown) by the recovery loop every pass, in hold too; database-wide, aggregate with max(); a pair seen before and gone falls back to 0
//	promptline_provider_response_id_write_failures_total best-effort writes of a provider's response ID while its attempt was in flight that failed (logged; the turn went on, and the ID is recorded with the outcome)
//	promptline_tool_calls_total{outcome}          tool calls settled, by outcome: succeeded | failed (including invalid and declined) | unknown
//	promptline_tool_call_seconds{outcome}         histogram of one tool run's latency
//	promptline_kafka_consumer_lag_messages{topic,partition} per partition assigned here: high-water mark minus the next offset to mark; removed when the partition is revoked
//	promptline_deltas_total{result}               live text deltas on session-deltas (not durable): published (acknowledged by the broker) | dropped (the producer was full, failed to deliver it, or was closed; the turn goes on, its text is committed with step.completed)
//
// The operator console (`consumer console`, docs/console.md) serves its own
// registry with these and the Go and process collectors:
//
//	promptline_console_requests_total{route,code} requests served, by route (login, sessions, session, timeline, quarantine, release, recovery, metrics, other) and HTTP status code
//	promptline_console_request_seconds{route}     histogram of a request's latency, by route
//
// Computed at scrape time (ScrapeCollector; each read bounded by 2s):
//
//	promptline_ready                              1 when ready (Postgres reachable, migrations applied, Kafka group joined, no broker silent on a request for 5s), else 0; /readyz says why not
//	promptline_database_stats_up                  1 when the database gauges below were read, 0 when the read failed (they are then absent)
//	promptline_outbox_backlog_rows                unpublished outbox rows, database-wide
//	promptline_outbox_oldest_unpublished_seconds  age of the oldest unpublished outbox row (0 when none), database-wide; a row whose created_at is not a time ('-infinity', 'infinity': a hand edit) has no age and is left out of it, not out of the backlog
//	promptline_permission_requests_pending        permission requests waiting for a reply, database-wide
//
// The database-wide gauges are the same on every replica: aggregate them
// with max(), not sum().
//
// The consumer exposes every outcome of promptline_provider_attempts_total
// and promptline_tool_calls_total, and every decision of
// promptline_recovery_decisions_total, at 0 from its start: a series that
// appeared at its first increment would hide that increment from rate().
//
// Plus the Go runtime and process collectors (go_*, process_*).
package metrics
