// Package inspect reads everything Postgres holds about one session — the
// session row, its inputs, the transcript, the claim, the ledger, recovery
// decisions and permission requests — into a Report, for operators
// (`consumer session show`).
//
// It only reads, in one read-only REPEATABLE READ transaction, so that the
// sections of a report agree with each other (a claim and the attempts it
// wrote come from the same snapshot). It never fails on a malformed row:
// inspecting is what an operator does when rows are bad. That includes a
// time that is not a time ('-infinity', 'infinity', which every
// timestamptz column admits): each time is read as a pgdb.Time, shown in
// words by Render, and in the JSON as the zero time with the words in the
// key beside it (Report).
//
// Texts are shown, because an operator asked for this session by name, but
// bounded: at most MaxTextRunes per transcript part (and per tool-call
// input), MaxOutputRunes per ledger output excerpt; every cut is marked.
package inspect
