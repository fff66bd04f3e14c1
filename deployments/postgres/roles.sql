-- promptline's Postgres roles: a migration role that owns the schema and a
-- runtime role that can only read and write rows (no DDL, no TRUNCATE).
--
-- Run it once per database with psql, connected to the promptline database
-- as a superuser or, on a managed service, the admin user; it is safe to
-- run again:
--
--   psql 'postgres://admin@db.example.com:5432/promptline?sslmode=verify-full&sslrootcert=ca.pem' \
--     -X -v ON_ERROR_STOP=1 -v owner_password="$OWNER_PW" -v runtime_password="$RUNTIME_PW" \
--     -f deployments/postgres/roles.sql
--
-- psql variables (-v NAME=VALUE), with their defaults:
--   owner_role        promptline_owner  runs `consumer migrate`; owns every table
--   runtime_role      promptline_app    runs the consumers (`--migrate=false`)
--   console_role      promptline_console runs `consumer console`: reads, and
--                                       releases quarantined rows (docs/console.md)
--   schema            promptline        the schema both roles use (search_path)
--   owner_password    (unset)           sets the owner role's password when given
--   runtime_password  (unset)           sets the runtime role's password when given
--   console_password  (unset)           sets the console role's password when given
-- Without the password variables, set them yourself (psql: \password ROLE)
-- or use your platform's IAM authentication.
--
-- The database should be promptline's alone: this revokes CREATE on the
-- public schema and TEMPORARY on the database from PUBLIC.
--
-- Managed services where the admin is not a superuser (PostgreSQL 16+,
-- CREATEROLE): ALTER DEFAULT PRIVILEGES FOR ROLE and CREATE SCHEMA
-- AUTHORIZATION need the admin to be able to SET ROLE to the owner; if they
-- fail with "must be able to SET ROLE", run
--   GRANT promptline_owner TO CURRENT_USER WITH SET TRUE;
-- first.

\set ON_ERROR_STOP on
\if :{?owner_role}
\else
  \set owner_role promptline_owner
\endif
\if :{?runtime_role}
\else
  \set runtime_role promptline_app
\endif
\if :{?console_role}
\else
  \set console_role promptline_console
\endif
\if :{?schema}
\else
  \set schema promptline
\endif

-- Roles: login, nothing else (no superuser, no CREATEDB, no CREATEROLE).
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION', :'owner_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'owner_role') \gexec
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION', :'runtime_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'runtime_role') \gexec
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION', :'console_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'console_role') \gexec
\if :{?console_password}
  ALTER ROLE :"console_role" PASSWORD :'console_password';
\endif
\if :{?owner_password}
  ALTER ROLE :"owner_role" PASSWORD :'owner_password';
\endif
\if :{?runtime_password}
  ALTER ROLE :"runtime_role" PASSWORD :'runtime_password';
\endif

-- The database: both roles connect; nobody creates temporary tables or
-- objects in public (PostgreSQL before 15 lets PUBLIC create there).
GRANT CONNECT ON DATABASE :"DBNAME" TO :"owner_role", :"runtime_role", :"console_role";
REVOKE CREATE, TEMPORARY ON DATABASE :"DBNAME" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- The schema belongs to the owner; the runtime role may only look up
-- names in it. Both find it first on their search_path in this database,
-- so the database URL needs no search_path.
CREATE SCHEMA IF NOT EXISTS :"schema" AUTHORIZATION :"owner_role";
REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;
GRANT USAGE ON SCHEMA :"schema" TO :"runtime_role";
ALTER ROLE :"owner_role" IN DATABASE :"DBNAME" SET search_path = :"schema";
ALTER ROLE :"runtime_role" IN DATABASE :"DBNAME" SET search_path = :"schema";
GRANT USAGE ON SCHEMA :"schema" TO :"console_role";
ALTER ROLE :"console_role" IN DATABASE :"DBNAME" SET search_path = :"schema";

-- What the consumer needs, for every table, view and sequence the owner
-- creates from now on (each migration): rows in, out, changed and
-- deleted; sequence values (promotion_seq; identity columns need no
-- grant, but a serial column would). No TRUNCATE, REFERENCES or TRIGGER.
-- `consumer migrate` then takes INSERT, UPDATE and DELETE on goose's
-- version table back from everyone but the owner: the runtime role reads
-- the schema version, it never writes it.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
  GRANT USAGE, SELECT ON SEQUENCES TO :"runtime_role";
-- Functions (promptline_fence, promptline_claim_as_read, and the trigger function
-- promptline_legacy_input_kind): PUBLIC may execute them by default, but a
-- cluster hardened against that must still let the runtime role.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
  GRANT EXECUTE ON FUNCTIONS TO :"runtime_role";

-- The same for what already exists (this script run again after
-- migrations, or roles added to a migrated database).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA :"schema" TO :"runtime_role";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA :"schema" TO :"runtime_role";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA :"schema" TO :"runtime_role";
SELECT format('REVOKE INSERT, UPDATE, DELETE ON %I.goose_db_version FROM %I', :'schema', :'runtime_role')
WHERE to_regclass(format('%I.goose_db_version', :'schema')) IS NOT NULL \gexec

-- The console role (`consumer console`, docs/console.md): it reads what the
-- runtime role reads, and may do one write, the audited release of a
-- quarantined row (recovery.Release, as `consumer quarantine release`):
-- clear the quarantine columns of a claim, an input or an outbox row, lock
-- the session row first (SELECT ... FOR UPDATE needs an UPDATE right: it
-- gets redriven_at, a hint, and no other column), insert the audit row and,
-- for a released input, its wake into the outbox. Nothing else: no DELETE,
-- no other column, no DDL. The column grants need the tables, so run this
-- script again after `consumer migrate` (it is safe to run again).
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
  GRANT SELECT ON TABLES TO :"console_role";
GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"console_role";
SELECT format('GRANT UPDATE (quarantine_reason, quarantined_at) ON %I.%I TO %I', :'schema', t, :'console_role')
FROM unnest(ARRAY['claims', 'inputs', 'outbox']) t
WHERE to_regclass(format('%I.%I', :'schema', t)) IS NOT NULL \gexec
SELECT format('GRANT UPDATE (redriven_at) ON %I.sessions TO %I', :'schema', :'console_role')
WHERE to_regclass(format('%I.sessions', :'schema')) IS NOT NULL \gexec
SELECT format('GRANT INSERT ON %I.%I TO %I', :'schema', t, :'console_role')
FROM unnest(ARRAY['quarantine_releases', 'outbox']) t
WHERE to_regclass(format('%I.%I', :'schema', t)) IS NOT NULL \gexec
