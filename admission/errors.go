package admission

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/promptline/promptline/envelope"
)

// errNotFound says that a statement returned no row (pgx.ErrNoRows).
var errNotFound = errors.New("no row")

// DataError is a deterministic data error of Postgres on an admission:
// one that the same statement on the same data gives again on every
// retry, so that the message is rejected instead (docs/design.md,
// invariant 13). AsDataError finds it in an error of Admit or AdmitAlone.
type DataError struct {
	Code    string // the SQLSTATE, of class 22 or 23
	Message string // the server's primary message
	err     error
}

// Error is the text of the error the admission returned: translating
// changes no message.
func (e *DataError) Error() string { return e.err.Error() }

// Unwrap returns the error the admission returned.
func (e *DataError) Unwrap() error { return e.err }

// maxRejectDetail bounds the detail of a data error's reject: the
// server's message may quote the refused value.
const maxRejectDetail = 256

// Reject is the reject of the message Postgres refused: reason
// envelope.ReasonDataError, the SQLSTATE and the server's message as its
// detail, cut to maxRejectDetail bytes. Live admission and replay
// reject a data error with it alike.
func (e *DataError) Reject() *envelope.RejectError {
	detail := fmt.Sprintf("Postgres refused it: SQLSTATE %s: %s", e.Code, e.Message)
	if len(detail) > maxRejectDetail {
		detail = strings.ToValidUTF8(detail[:maxRejectDetail], "")
	}
	return &envelope.RejectError{Reason: envelope.ReasonDataError, Detail: detail}
}

// interpretError is the package's only translation of driver errors
// (River's interpretError): no other file of the package tests
// pgx.ErrNoRows or a SQLSTATE, and no other package tests the SQLSTATE
// of an admission's error (pipeline asks AsDataError).
// docs/ownership_test.go holds every package to this.
//
// A server error of SQLSTATE class 22 (data exception: a character
// Postgres cannot store, a value out of range) or 23 (integrity
// constraint violation) becomes a *DataError; pgx.ErrNoRows, wrapped or
// not, becomes errNotFound. Any other error, nil included, is returned as
// it is, so that a caller's wrapped message is the driver's. Everything
// else is no data error, and a retry may cure it: lost connections,
// serialization failures (40001), deadlocks (40P01), lock timeouts
// (55P03), cancelled statements (57014), terminated backends (57P01), and
// errors an operator can fix (a privilege, a full disk) without the
// message changing.
func interpretError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if class := pgErr.Code[:min(2, len(pgErr.Code))]; class == "22" || class == "23" {
			return &DataError{Code: pgErr.Code, Message: pgErr.Message, err: err}
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotFound
	}
	return err
}

// AsDataError returns the data error that err, returned by Admit,
// AdmitAlone or AdmitReply, carries, and whether it carries one.
func AsDataError(err error) (*DataError, bool) {
	var de *DataError
	ok := errors.As(interpretError(err), &de)
	return de, ok
}
