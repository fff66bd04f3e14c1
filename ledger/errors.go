package ledger

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/promptline/promptline/internal/pgdb"
)

// This file is the ledger's only translation of driver errors (River's
// interpretError): no other file of the package tests pgx.ErrNoRows or a
// SQLSTATE. A statement's error goes through interpretError, and the
// caller tests the result with errors.Is against the sentinels below,
// then returns its own error (ErrClaimHeld, ErrFenced, a wrapped err) as
// before. docs/ownership_test.go holds every package to this.

var (
	// errNotFound says that the statement returned no row (pgx.ErrNoRows).
	errNotFound = errors.New("no row")
	// errFenceRaised says that promptline_fence raised fencedCode: the
	// claim is lost.
	errFenceRaised = errors.New("fence raised by the server")
	// errStaleRaised says that promptline_claim_as_read raised staleCode:
	// the session changed since it was read.
	errStaleRaised = errors.New("claim as read refused by the server")
	// errAppliedRaised says that promptline_fence raised appliedCode: the
	// write's position is already applied under the claim.
	errAppliedRaised = errors.New("write already applied, says the server")
	// errWriteApplied is a retry's finding that the write it retries
	// landed (errAppliedRaised from its fence): the retry is done.
	errWriteApplied = errors.New("write already applied")
)

// errNoRow is what a QueryRow finding no row returns, as pgx's: the
// callbacks of a combined transaction read their rows through
// groupcommit.go's ownRow, which must answer as pgx's row does, for the
// callback and interpretError alike.
var errNoRow = pgx.ErrNoRows

// interpretError translates a driver error into the ledger's sentinels:
// the SQLSTATEs raised by the ledger's SQL functions into errFenceRaised,
// errStaleRaised and errAppliedRaised (a lost claim is never mistaken for anything else),
// pgx.ErrNoRows into errNotFound. Any other error, nil included, is
// returned as it is, so that the caller's wrapped message is the
// driver's.
func interpretError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == fencedCode:
		return errFenceRaised
	case errors.As(err, &pgErr) && pgErr.Code == staleCode:
		return errStaleRaised
	case errors.As(err, &pgErr) && pgErr.Code == appliedCode:
		return errAppliedRaised
	case errors.Is(err, pgx.ErrNoRows):
		return errNotFound
	}
	return err
}

// rolledBack reports whether err is the server's refusal of the
// transaction (an error of severity ERROR, which rolls back the implicit
// transaction), as opposed to a lost connection or a terminated backend
// (FATAL), after which the transaction may have committed.
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgdb.IsError(pgErr)
}
