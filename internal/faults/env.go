package faults

// EnvVars are the variables that steer fault injection: PROMPTLINE_
// variables that are not settings, so the configuration loader leaves
// them alone (in every build: a normal binary ignores them).
var EnvVars = []string{"PROMPTLINE_FAULT", "PROMPTLINE_FAULT_COMMIT", "PROMPTLINE_FAULT_COMMIT_LOG", "PROMPTLINE_FAULT_DEFAULT_DATABASE_URL"}
