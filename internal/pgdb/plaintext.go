package pgdb

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PlaintextRemote reports whether a connection to remote is unencrypted
// and leaves the machine: what Open warns about. Unix sockets and loopback
// addresses stay on the machine; any other address is remote.
func PlaintextRemote(remote net.Addr, encrypted bool) bool {
	if encrypted || remote == nil {
		return false
	}
	switch a := remote.(type) {
	case *net.UnixAddr:
		return false
	case *net.TCPAddr:
		return a != nil && !a.IP.IsLoopback()
	}
	host, _, err := net.SplitHostPort(remote.String())
	if err != nil {
		host = remote.String()
	}
	ip := net.ParseIP(host)
	return host != "localhost" && (ip == nil || !ip.IsLoopback())
}

// warnPlaintext looks at one pooled connection: the one the server
// actually accepted, whatever sslmode (prefer falls back to plaintext) and
// host list the URL gave.
func warnPlaintext(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connecting to Postgres: %w", err)
	}
	defer conn.Release()
	nc := conn.Conn().PgConn().Conn()
	_, encrypted := nc.(*tls.Conn)
	if PlaintextRemote(nc.RemoteAddr(), encrypted) {
		log.WarnContext(ctx, "the Postgres connection is not encrypted and leaves this machine: "+
			"use sslmode=verify-full with sslrootcert=<CA file> in the database URL (docs/deploy.md)",
			slog.String("server", nc.RemoteAddr().String()))
	}
	return nil
}
