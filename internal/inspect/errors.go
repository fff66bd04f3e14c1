package inspect

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// interpretError is the package's only translation of driver errors
// (River's interpretError): no other file of the package tests
// pgx.ErrNoRows or a SQLSTATE. It turns pgx.ErrNoRows, wrapped or not,
// into ErrNotFound and returns any other error, nil included, as it is,
// so that a caller's wrapped message is the driver's. Callers test the
// result with errors.Is and return their own error as before.
// docs/ownership_test.go holds every package to this.
func interpretError(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}
