package pgdb

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The two values a timestamptz column admits that are not a time, in
// Postgres's own words (its text output and to_json's).
const (
	NegativeInfinity = "-infinity"
	Infinity         = "infinity"
)

// Time is a timestamptz as read: a time, or one of the two values the
// column admits that are not a time. No writer of promptline sets
// '-infinity' or 'infinity', but a hand edit, a restore or a repair
// script may, and the driver cannot read them into a time.Time: a reader
// scanning into one fails on the row, and with it a report, a list or a
// pass over every other row. Scan into a Time (a *Time for a nullable
// column) what such a row must not fail.
//
// Format is the time's, or the value's words, "-infinity" or "infinity",
// in place of the time. Its JSON is the time's, the zero time when it is
// not a time: a JSON document carries the words in a key of its own beside
// it, named after the time's key with "_not_finite" (NotFiniteOrNil), as
// recovery's evidence carries expired_at_not_finite. So a key that holds a
// time always holds one, whatever the row, and a reader that parses it as
// a time never fails on it.
type Time struct {
	// At is the time; zero when NotFinite is set.
	At time.Time
	// NotFinite is NegativeInfinity or Infinity when the value is not a
	// time; "" when it is.
	NotFinite string
}

var (
	_ pgtype.TimestamptzScanner = (*Time)(nil)
	_ pgtype.TimestamptzValuer  = Time{}
	_ json.Marshaler            = Time{}
	_ json.Unmarshaler          = (*Time)(nil)
)

// TimeOf is the Time of t.
func TimeOf(t time.Time) Time { return Time{At: t} }

// IsFinite says whether t is a time.
func (t Time) IsFinite() bool { return t.NotFinite == "" }

// NotFiniteOrNil is the value in words when t is not a time, nil when it
// is: the *_not_finite key of a JSON document that keeps every key, null
// when unset.
func (t Time) NotFiniteOrNil() *string {
	if t.IsFinite() {
		return nil
	}
	s := t.NotFinite
	return &s
}

// UTC is t with its time in UTC.
func (t Time) UTC() Time {
	if t.IsFinite() {
		t.At = t.At.UTC()
	}
	return t
}

// Format is the time formatted by layout, or the value in words when it
// is not a time.
func (t Time) Format(layout string) string {
	if !t.IsFinite() {
		return t.NotFinite
	}
	return t.At.Format(layout)
}

// String is Format(time.RFC3339Nano).
func (t Time) String() string { return t.Format(time.RFC3339Nano) }

// Compare orders t and u as Postgres does: '-infinity' before every time,
// 'infinity' after; -1, 0 or +1.
func (t Time) Compare(u Time) int {
	if r := rank(t) - rank(u); r != 0 || !t.IsFinite() {
		return max(-1, min(1, r))
	}
	return t.At.Compare(u.At)
}

func rank(t Time) int {
	switch t.NotFinite {
	case NegativeInfinity:
		return -1
	case Infinity:
		return 1
	}
	return 0
}

// ScanTimestamptz reads a timestamptz; NULL fails (scan a nullable column
// into a *Time, which NULL leaves nil).
func (t *Time) ScanTimestamptz(v pgtype.Timestamptz) error {
	if !v.Valid {
		return errors.New("cannot scan NULL into pgdb.Time")
	}
	switch v.InfinityModifier {
	case pgtype.NegativeInfinity:
		*t = Time{NotFinite: NegativeInfinity}
	case pgtype.Infinity:
		*t = Time{NotFinite: Infinity}
	default:
		*t = Time{At: v.Time}
	}
	return nil
}

// TimestamptzValue passes t as an argument, infinities included (a keyset
// cursor positioned on such a row).
func (t Time) TimestamptzValue() (pgtype.Timestamptz, error) {
	switch t.NotFinite {
	case "":
		return pgtype.Timestamptz{Time: t.At, Valid: true}, nil
	case NegativeInfinity:
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, nil
	case Infinity:
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, nil
	}
	return pgtype.Timestamptz{}, fmt.Errorf("pgdb.Time: %q is neither %s nor %s", t.NotFinite, NegativeInfinity, Infinity)
}

// MarshalJSON is the time's JSON (RFC 3339); the zero time when t is not
// a time (its words go in a key of their own: NotFiniteOrNil).
func (t Time) MarshalJSON() ([]byte, error) { return t.At.MarshalJSON() }

// UnmarshalJSON reads a time's JSON.
func (t *Time) UnmarshalJSON(b []byte) error {
	*t = Time{}
	return t.At.UnmarshalJSON(b)
}

// ParseTime reads s as Format(layout) writes it.
func ParseTime(layout, s string) (Time, error) {
	if s == NegativeInfinity || s == Infinity {
		return Time{NotFinite: s}, nil
	}
	at, err := time.Parse(layout, s)
	return Time{At: at}, err
}
