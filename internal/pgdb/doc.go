// Package pgdb opens promptline's Postgres: it resolves the database URL
// (flag, DATABASE_URL, the default local server, or a throwaway cluster
// started from the machine's PostgreSQL binaries), applies the embedded,
// numbered migrations under an advisory lock, and translates driver errors.
package pgdb
