package recovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/kafkautil"
)

// Outcomes of one row of a bulk release (BulkReleaseRow.Outcome).
const (
	// OutcomeReleased: released and audited, as by Release.
	OutcomeReleased = "released"
	// OutcomeRefused: a claim that still fails validation (ErrStillInvalid);
	// left quarantined, nothing written.
	OutcomeRefused = "refused"
	// OutcomeSkipped: no longer quarantined as listed (released by someone
	// else, or released and quarantined again, since it was listed);
	// nothing written.
	OutcomeSkipped = "skipped"
	// OutcomeWouldRelease: a dry run's row; nothing written.
	OutcomeWouldRelease = "would_release"
)

// bulkPageDefault is the rows a bulk release lists at a time.
const bulkPageDefault = 500

// BulkReleaseOpts describes a bulk release.
type BulkReleaseOpts struct {
	// Kind is the kind of the rows released: KindClaim, KindInput or
	// KindOutbox.
	Kind string
	// ReasonContains keeps the rows whose reason contains it, as written
	// (no pattern, case counts). Defaults to every row of the kind: a
	// command asks its operator to say so (consumer quarantine release
	// --any-reason).
	ReasonContains string
	// DryRun lists the rows that would be released and writes nothing.
	// Defaults to false.
	DryRun bool
	// Operator names who releases the rows, recorded in each row's audit.
	Operator string
	// Note says what was repaired, recorded in each row's audit. Defaults
	// to none.
	Note string
	// Topics names the outbox targets of a released input's wake. Defaults
	// to kafkautil's defaults.
	Topics kafkautil.Topics
	// PageSize bounds the rows listed at a time. Defaults to 500.
	PageSize int
}

// BulkReleaseRow is what a bulk release did with one row.
type BulkReleaseRow struct {
	QuarantinedRow
	// Outcome is one of the Outcome constants.
	Outcome string `json:"outcome"`
	// Detail says why a row was refused or skipped; empty otherwise.
	Detail string `json:"detail,omitempty"`
}

// BulkReleaseSummary counts the outcomes of a bulk release.
type BulkReleaseSummary struct {
	Released     int  `json:"released"`
	Refused      int  `json:"refused"`
	Skipped      int  `json:"skipped"`
	WouldRelease int  `json:"would_release"`
	DryRun       bool `json:"dry_run"`
}

// ReleaseMatching releases, one by one, the quarantined rows of a kind
// whose reason contains opts.ReasonContains and that were quarantined
// before it began, oldest first, and calls fn with what it did with each
// (fn's error stops it).
//
// Each row goes through Release, in a transaction of its own (its
// session's row lock first, its audit, its wake), guarded by the
// quarantine time it was listed with: a bulk of any size holds one
// session's lock at a time, and a stop leaves every release before it
// committed and audited, and the rest for the next run. A claim that still
// fails validation is refused and left as it is; a row released, or
// released and quarantined again, since it was listed is skipped; neither
// stops the rest. Any other error stops the release and is returned with
// the summary so far, as is the context's error when ctx ends.
func ReleaseMatching(ctx context.Context, pool *pgxpool.Pool, opts *BulkReleaseOpts, fn func(BulkReleaseRow) error) (BulkReleaseSummary, error) {
	sum := BulkReleaseSummary{DryRun: opts.DryRun}
	switch opts.Kind {
	case KindClaim, KindInput, KindOutbox:
	default:
		return sum, fmt.Errorf("unknown kind %q: want %s, %s or %s", opts.Kind, KindClaim, KindInput, KindOutbox)
	}
	// The database's clock, as quarantined_at is written by it.
	var began time.Time
	if err := pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&began); err != nil {
		return sum, fmt.Errorf("reading the database's clock: %w", err)
	}
	page := &quarantinedPageParams{Kind: opts.Kind, ReasonContains: opts.ReasonContains, Before: began,
		Limit: cmp.Or(opts.PageSize, bulkPageDefault)}
	for {
		rows, err := listQuarantinedPage(ctx, pool, page)
		if err != nil {
			return sum, err
		}
		for _, q := range rows {
			r, err := releaseListed(ctx, pool, q, opts)
			if err != nil {
				return sum, err
			}
			switch r.Outcome {
			case OutcomeReleased:
				sum.Released++
			case OutcomeRefused:
				sum.Refused++
			case OutcomeSkipped:
				sum.Skipped++
			case OutcomeWouldRelease:
				sum.WouldRelease++
			}
			if err := fn(r); err != nil {
				return sum, err
			}
		}
		if len(rows) < page.Limit {
			return sum, nil
		}
		last := rows[len(rows)-1]
		page.After, page.AfterID = &last.QuarantinedAt, last.ID
	}
}

// releaseListed releases one listed row through Release, guarded by the
// quarantine time it was listed with.
func releaseListed(ctx context.Context, pool *pgxpool.Pool, q QuarantinedRow, opts *BulkReleaseOpts) (BulkReleaseRow, error) {
	r := BulkReleaseRow{QuarantinedRow: q}
	if opts.DryRun {
		r.Outcome = OutcomeWouldRelease
		return r, nil
	}
	at := q.QuarantinedAt
	err := Release(ctx, pool, q.Kind, q.ID, &ReleaseOpts{Operator: opts.Operator, Note: opts.Note, Topics: opts.Topics, QuarantinedAt: &at})
	switch {
	case err == nil:
		r.Outcome = OutcomeReleased
	case errors.Is(err, ErrStillInvalid):
		r.Outcome, r.Detail = OutcomeRefused, err.Error()
	case errors.Is(err, ErrNotQuarantined):
		r.Outcome, r.Detail = OutcomeSkipped, "no longer quarantined as listed: released, or released and quarantined again, meanwhile"
	default:
		return r, err
	}
	return r, nil
}
