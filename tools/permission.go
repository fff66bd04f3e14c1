package tools

import "fmt"

// Permission is the approval policy for calls of a tool.
type Permission string

const (
	// Allow: the call runs without asking.
	Allow Permission = "allow"
	// Deny: the call is refused without asking.
	Deny Permission = "deny"
	// Ask: the call waits for a durable approval.
	Ask Permission = "ask"
)

// ParsePermission parses "allow", "deny" or "ask".
func ParsePermission(s string) (Permission, error) {
	switch p := Permission(s); p {
	case Allow, Deny, Ask:
		return p, nil
	}
	return "", fmt.Errorf("unknown permission %q (want %q, %q or %q)", s, Allow, Deny, Ask)
}
