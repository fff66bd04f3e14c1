package transcript

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// errNotFound says that a statement returned no row (pgx.ErrNoRows).
var errNotFound = errors.New("no row")

// interpretError is the package's only translation of driver errors
// (River's interpretError): no other file of the package tests
// pgx.ErrNoRows or a SQLSTATE. It turns pgx.ErrNoRows, wrapped or not,
// into errNotFound and returns any other error, nil included, as it is,
// so that the error a caller wraps is the driver's. Callers test the
// result with errors.Is. docs/ownership_test.go holds every package to
// this.
func interpretError(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotFound
	}
	return err
}

// UnreadablePartError says that a stored part of a session's transcript
// cannot be read back: a tool call's body that does not decode as
// ToolCallPart. No writer stores one (the executor stores what
// json.Marshal made of a ToolCallPart); a hand edit, a restore or an old
// bug can. The session's history cannot be read until the part is
// repaired.
type UnreadablePartError struct {
	MessageID string
	Index     int   // the part's idx
	Err       error // why it does not decode
}

func (e *UnreadablePartError) Error() string {
	return fmt.Sprintf("message %s part %d: tool call part is not JSON {id, name, input}: %v", e.MessageID, e.Index, e.Err)
}

func (e *UnreadablePartError) Unwrap() error { return e.Err }
