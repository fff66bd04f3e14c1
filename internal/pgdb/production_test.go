package pgdb_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/pem"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

// Upgrades (issue 8, item 7) and transport security (item 3).

// schemaURL returns the URL of a new, empty schema in a fresh test database
// (the database's own schema is migrated already): the URL's search_path
// puts everything the migrations create there, goose's table included.
func schemaURL(t *testing.T, schema string) string {
	t.Helper()
	url := testkit.DatabaseURL(t)
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

func openSQL(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

func TestMigrateFromEmptyDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := schemaURL(t, "empty")
	db := openSQL(t, url)
	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Zero(t, v, "no goose table yet: version 0")

	// Three consumers booting at once on an empty schema: the advisory
	// lock lets one migrate, the others find nothing pending.
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			d, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url})
			if err == nil {
				err = d.Close()
			}
			errs <- err
		}()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	v, err = pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Equal(t, pgdb.LatestVersion(), v)
	var applied int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&applied))
	require.Len(t, migrationVersions(t), applied, "each migration applied once")
	var tables int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'empty'`).Scan(&tables))
	require.Greater(t, tables, 10)
	require.NoError(t, pgdb.CheckVersion(ctx, db))
}

// migrationVersions are the versions of the migrations, in order. They
// may skip a number (one kept for a change still under way), as goose
// allows.
func migrationVersions(t *testing.T) []int64 {
	t.Helper()
	entries, err := fs.ReadDir(pgdb.Migrations(), ".")
	require.NoError(t, err)
	var versions []int64
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		require.NoError(t, err, e.Name())
		versions = append(versions, v)
	}
	slices.Sort(versions)
	require.Equal(t, pgdb.LatestVersion(), versions[len(versions)-1])
	return versions
}

// previousReleaseRows are representative rows of the schema as of
// migration 4 (the release before permissions); they stay valid for every
// later N-1, since migrations only add.
const previousReleaseRows = `
INSERT INTO sessions (session_id, fencing_token) VALUES ('s-old', 3), ('s-waiting', 0);
INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, promotion_seq, wake_pending,
                    source_topic, source_partition, source_offset, promoted_at)
VALUES ('m-done', 's-old', 'hello', '\x01', 'queue', nextval('promotion_seq'), false, 'prompts', 0, 41, now()),
       ('m-wait', 's-waiting', 'later', '\x02', 'steer', NULL, true, 'prompts', 1, 7, NULL);
-- Internal inputs as the old code wrote them, and prompts only named like
-- them (migration 11 tells them apart by their payload hash).
INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, promotion_seq, wake_pending, promoted_at)
VALUES ('permission-reply-call-0', 's-old', '', sha256('permission-reply:call-0'), 'steer', nextval('promotion_seq'), true, now()),
       ('recovery-continue-e-0', 's-old', '', sha256('continuation:s-old:e-0'), 'steer', nextval('promotion_seq'), true, now()),
       ('permission-reply-call-9', 's-old', 'a prompt', '\x05', 'queue', nextval('promotion_seq'), true, now()),
       ('recovery-continue-e-9', 's-old', 'a prompt', '\x06', 'queue', nextval('promotion_seq'), true, now());
INSERT INTO outbox (topic, key, payload, published_at)
VALUES ('session-events', 's-old', '{"type":"turn.completed"}', now()), ('wakes', 's-waiting', '{}', NULL);
INSERT INTO messages (message_id, session_id, role, status, execution_id, fencing_token, turn_id, tool_call_id, completed_at)
VALUES ('m-done', 's-old', 'user', 'completed', 'e-1', 3, 'm-done', NULL, now()),
       ('a-1', 's-old', 'assistant', 'completed', 'e-1', 3, 'm-done', NULL, now()),
       ('t-1', 's-old', 'tool', 'completed', 'e-1', 3, 'm-done', 'call-1', now());
INSERT INTO message_parts (message_id, idx, kind, body)
VALUES ('m-done', 0, 'text', 'hello'), ('a-1', 0, 'tool_call', '{"tool":"echo"}'), ('a-1', 1, 'text', 'echo: hello');
INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at)
VALUES ('s-old', 'e-1', 'consumer-old', 3, 'ready', 'a-1', now() + interval '1 hour');
INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider, idempotency_key,
                      fencing_token, request_hash, state, finished_at)
VALUES ('att-1', 's-old', 'e-1', 'a-1', 0, 'scripted', 'k-1', 3, '\x03', 'succeeded', now());
INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class, input,
                        idempotency_key, fencing_token, state, output, is_error)
VALUES ('call-1', 'att-1', 's-old', 'e-1', 0, 'mc-1', 'echo', 'idempotent', '{"text":"hello"}', 'k-call-1', 3,
        'succeeded', 'hello', false);
INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by)
VALUES ('e-0', 's-old', 'ready', 'rewoken', '{"inputs_waiting":1}', 1, 2, 'recovery-old');
INSERT INTO quarantine_releases (kind, ref, reason, released_by) VALUES ('claim', 's-old', 'test', 'operator');
`

// TestMigrateFromPreviousRelease builds the previous release's schema
// (every migration but the last) with data in it, then upgrades it the
// way a new consumer does, and checks that the data is intact and usable
// by the new schema.
func TestMigrateFromPreviousRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := schemaURL(t, "previous")
	db := openSQL(t, url)
	versions := migrationVersions(t)
	previous := versions[len(versions)-2]
	require.GreaterOrEqual(t, previous, int64(4), "the fixture rows need the schema of migration 4")
	p, err := goose.NewProvider(goose.DialectPostgres, db, pgdb.Migrations())
	require.NoError(t, err)
	_, err = p.UpTo(ctx, previous)
	require.NoError(t, err)
	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Equal(t, previous, v)
	_, err = db.ExecContext(ctx, previousReleaseRows)
	require.NoError(t, err)

	countAll := func() map[string]int {
		out := map[string]int{}
		for _, table := range []string{"sessions", "inputs", "outbox", "messages", "message_parts", "claims",
			"attempts", "tool_calls", "recoveries", "quarantine_releases"} {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n), table)
			out[table] = n
		}
		return out
	}
	before := countAll()

	// A consumer of the new release starts: it applies the rest.
	var logs bytes.Buffer
	d, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.Contains(t, logs.String(), fmt.Sprintf(`"msg":"schema migrated","from_version":%d,"to_version":%d`, previous, pgdb.LatestVersion()))
	require.NoError(t, pgdb.CheckVersion(ctx, db))

	t.Run("DataIntact", func(t *testing.T) {
		require.Equal(t, before, countAll())
		var hash []byte
		var promoted sql.NullInt64
		require.NoError(t, db.QueryRowContext(ctx, `SELECT payload_hash, promotion_seq FROM inputs WHERE message_id = 'm-done'`).Scan(&hash, &promoted))
		require.Equal(t, []byte{1}, hash)
		require.True(t, promoted.Valid)
		var token int64
		var phase string
		require.NoError(t, db.QueryRowContext(ctx, `SELECT fencing_token, phase FROM claims WHERE session_id = 's-old'`).Scan(&token, &phase))
		require.Equal(t, []any{int64(3), "ready"}, []any{token, phase})
		var unpublished int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished))
		require.Equal(t, 1, unpublished, "the relay still finds the unpublished row")
	})

	t.Run("NewSchemaUsableWithOldRows", func(t *testing.T) {
		waiting := func() []string {
			rows, err := db.QueryContext(ctx, `SELECT message_id FROM waiting_inputs ORDER BY admission_seq`)
			require.NoError(t, err)
			defer rows.Close()
			var ids []string
			for rows.Next() {
				var id string
				require.NoError(t, rows.Scan(&id))
				ids = append(ids, id)
			}
			require.NoError(t, rows.Err())
			return ids
		}
		require.Equal(t, []string{"m-wait"}, waiting(), "the old waiting input is waiting under the new definition")

		// A permission request on an old tool call parks the old session:
		// only its reply's input waits. Defaults fill what old code never
		// wrote.
		_, err := db.ExecContext(ctx, `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
			VALUES ('call-1', 's-waiting', 'call-1', 'echo', 'echo', 'pending')`)
		require.NoError(t, err)
		var metadata string
		var askedAt time.Time
		require.NoError(t, db.QueryRowContext(ctx, `SELECT metadata::text, asked_at FROM permission_requests WHERE request_id = 'call-1'`).Scan(&metadata, &askedAt))
		require.Equal(t, "{}", metadata)
		require.WithinDuration(t, time.Now(), askedAt, time.Minute)
		require.Empty(t, waiting())
		// As a consumer of the previous release admits a reply's input
		// (no kind): the trigger classifies it.
		_, err = db.ExecContext(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('permission-reply-call-1', 's-waiting', '', sha256('permission-reply:call-1'), 'steer', true)`)
		require.NoError(t, err)
		require.Equal(t, []string{"permission-reply-call-1"}, waiting())

		kinds := map[string]string{}
		rows, err := db.QueryContext(ctx, `SELECT message_id, kind FROM inputs`)
		require.NoError(t, err)
		for rows.Next() {
			var id, kind string
			require.NoError(t, rows.Scan(&id, &kind))
			kinds[id] = kind
		}
		require.NoError(t, rows.Err())
		require.Equal(t, map[string]string{"m-done": "prompt", "m-wait": "prompt",
			"permission-reply-call-0": "permission_reply", "recovery-continue-e-0": "continuation",
			"permission-reply-call-9": "prompt", "recovery-continue-e-9": "prompt",
			"permission-reply-call-1": "permission_reply"}, kinds, "internal inputs told by their hash, not their name")
		_, err = db.ExecContext(ctx, `UPDATE inputs SET kind = 'other' WHERE message_id = 'm-done'`)
		require.ErrorContains(t, err, "inputs_kind", "the kinds are closed")

		// Identity columns and promotion_seq continue after the old rows.
		var newer bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT (SELECT admission_seq FROM inputs WHERE message_id = 'permission-reply-call-1')
			> (SELECT max(admission_seq) FROM inputs WHERE message_id <> 'permission-reply-call-1')
			AND nextval('promotion_seq') > (SELECT max(promotion_seq) FROM inputs)`).Scan(&newer))
		require.True(t, newer)
	})
}

// TestRefusesNewerSchema: a database migrated by a newer release (a
// version row above this binary's last migration) stops Open, migrating
// or not, with both versions in the message.
func TestRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testkit.DatabaseURL(t)
	db := openSQL(t, url)
	newer := pgdb.LatestVersion() + 1
	_, err := db.ExecContext(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, newer)
	require.NoError(t, err)
	for _, noMigrate := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoMigrate%t", noMigrate), func(t *testing.T) {
			_, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url, NoMigrate: noMigrate})
			require.ErrorIs(t, err, pgdb.ErrSchemaTooNew)
			var sv *pgdb.SchemaVersionError
			require.ErrorAs(t, err, &sv)
			require.Equal(t, pgdb.SchemaVersionError{Database: newer, Binary: pgdb.LatestVersion()}, *sv)
			require.Contains(t, err.Error(), fmt.Sprintf("database schema is at version %d, newer than this binary knows (version %d)", newer, pgdb.LatestVersion()))
		})
	}
	// Nothing was applied or removed.
	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Equal(t, newer, v)
}

// TestNoMigrateOnlyChecks: with NoMigrate, an unmigrated schema is refused
// (nothing is created), a migrated one accepted.
func TestNoMigrateOnlyChecks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := schemaURL(t, "unmigrated")
	db := openSQL(t, url)
	_, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url, NoMigrate: true})
	require.ErrorIs(t, err, pgdb.ErrSchemaBehind)
	require.Contains(t, err.Error(), fmt.Sprintf("database schema is at version 0, this binary needs version %d", pgdb.LatestVersion()))
	require.Contains(t, err.Error(), "consumer migrate")
	var tables int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'unmigrated'`).Scan(&tables))
	require.Zero(t, tables, "NoMigrate creates nothing, not even goose's table")

	d, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	d, err = pgdb.Open(ctx, pgdb.OpenOpts{URL: url, NoMigrate: true})
	require.NoError(t, err)
	require.NoError(t, d.Close())
}

type namedAddr string

func (a namedAddr) Network() string { return "tcp" }
func (a namedAddr) String() string  { return string(a) }

func TestPlaintextRemote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		addr      net.Addr
		encrypted bool
		want      bool
	}{
		{"RemotePlaintext", &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5432}, false, true},
		{"RemoteIPv6Plaintext", &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 5432}, false, true},
		{"RemoteEncrypted", &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5432}, true, false},
		{"LoopbackIPv4", &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5432}, false, false},
		{"LoopbackIPv6", &net.TCPAddr{IP: net.IPv6loopback, Port: 5432}, false, false},
		{"UnixSocket", &net.UnixAddr{Name: "/run/postgresql/.s.PGSQL.5432", Net: "unix"}, false, false},
		{"NoAddress", nil, false, false},
		{"OtherAddrRemote", namedAddr("db.example.com:5432"), false, true},
		{"OtherAddrLocalhost", namedAddr("localhost:5432"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, pgdb.PlaintextRemote(tc.addr, tc.encrypted))
		})
	}
}

// testCA is a certificate authority and a server certificate it signed.
type testCA struct {
	caPEM, certPEM, keyPEM []byte
}

func newTestCA(t *testing.T, serverIPs ...net.IP) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "promptline test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "postgres"}, IPAddresses: serverIPs,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return testCA{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
}

// TestVerifyFullWithCAFile: a server with TLS, the URL recommended in
// docs/deploy.md (sslmode=verify-full, sslrootcert=CA file) connects
// encrypted and without the plaintext warning; an untrusted CA and a host
// name the certificate does not name fail.
func TestVerifyFullWithCAFile(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	good := newTestCA(t, net.ParseIP("127.0.0.1"))
	other := newTestCA(t, net.ParseIP("127.0.0.1"))
	c, err := pgdb.StartClusterWith(ctx, &pgdb.ClusterConfig{
		Files:    map[string][]byte{"server.crt": good.certPEM, "server.key": good.keyPEM},
		Settings: map[string]string{"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Stop()) })
	dir := t.TempDir()
	goodCA, otherCA := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other-ca.pem")
	require.NoError(t, os.WriteFile(goodCA, good.caPEM, 0o600))
	require.NoError(t, os.WriteFile(otherCA, other.caPEM, 0o600))
	url := func(host, mode, ca string) string {
		return fmt.Sprintf("postgres://promptline@%s:%d/postgres?sslmode=%s&sslrootcert=%s&connect_timeout=10", host, c.Port, mode, ca)
	}

	t.Run("TrustedCA", func(t *testing.T) {
		var logs bytes.Buffer
		db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url("127.0.0.1", "verify-full", goodCA), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		require.NoError(t, err)
		defer db.Close()
		var ssl bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl))
		require.True(t, ssl)
		require.NotContains(t, logs.String(), "not encrypted")
	})
	t.Run("UntrustedCA", func(t *testing.T) {
		_, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url("127.0.0.1", "verify-full", otherCA)})
		require.ErrorContains(t, err, "certificate signed by unknown authority")
	})
	t.Run("HostNotInCertificate", func(t *testing.T) {
		_, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url("localhost", "verify-full", goodCA)})
		require.ErrorContains(t, err, "x509: certificate is not valid for any names, but wanted to match localhost")
	})
}

// TestHotPathMigrationRunsAgain: migration 00007 runs outside a
// transaction (its indexes are built CONCURRENTLY), so a run cut short —
// by the lock timeout, or a crash — leaves some of its statements applied
// and no version recorded, and the next `consumer migrate` runs the whole
// file again. It must then succeed and leave every index valid.
func TestHotPathMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// As if the run had been cut short after its last statement: applied,
	// not recorded.
	db, rerun := migratedTo(t, "rerun", 7)
	rerun()
	require.Equal(t, []string{"inputs_redrive_admitted", "inputs_waiting_session"},
		indexes(t, db, "rerun", true, "inputs_waiting_session", "inputs_redrive_admitted", "inputs_waiting", "inputs_redrive", "claims_expiry"),
		"the new indexes, valid, and none of the old")
	var fence int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'rerun' AND p.proname = 'promptline_fence'`).Scan(&fence))
	require.Equal(t, 1, fence)
}
