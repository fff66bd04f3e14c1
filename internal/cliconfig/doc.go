// Package cliconfig layers configuration over a cobra command tree: every
// flag can also be set by an environment variable (a prefix and the flag
// name in upper case with underscores: --db-max-conns is
// PROMPTLINE_DB_MAX_CONNS) and by a YAML config file whose keys are the
// flag names. Precedence: flag > environment > file > default.
//
// Invariants:
//   - A key of the file, or a prefixed environment variable, that names no
//     flag of any command in the tree stops the program, naming it, unless
//     it is a setting of the other promptline program (Programs): one
//     environment or file may serve both. A value that does not parse
//     stops it too, naming the key and its source.
//   - A key applies to every command that has a flag of that name; a flag
//     marked CommandLineOnly (its name means something else there) is
//     never read from the environment or the file.
//   - The effective configuration is printed with secrets redacted: the
//     password of any URL, and the value of any setting whose name holds
//     password, token or secret (files are printed as paths; their
//     contents are never read here).
//
// Reading goes through koanf (file + YAML parser, environment, posflag),
// so the parsing of YAML and of the environment is not ours.
package cliconfig
