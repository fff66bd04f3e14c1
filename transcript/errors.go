package transcript

import (
	"errors"

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
