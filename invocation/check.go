package invocation

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// CheckRetention reports whether retention is one a redisstate.Store applies:
// 0 deletes a message's state when it leaves the PEL, a positive value (>=
// 1ms, millisecond precision) keeps it that long. Every StateStore refuses
// what it refuses.
func CheckRetention(retention time.Duration) error {
	if retention != 0 && retention < time.Millisecond {
		return fmt.Errorf("retention %v: must be 0 (delete) or >= 1ms", retention)
	}
	return nil
}

// CheckRecord reports whether rec may go with a Claim of field: its fields
// non-empty, without the reserved "__" prefix, other than field and each
// other. Every StateStore refuses what it refuses.
func CheckRecord(field string, rec Record) error {
	seen := map[string]bool{field: true}
	for _, f := range rec.Fields {
		if f == "" || strings.HasPrefix(f, "__") || seen[f] {
			return fmt.Errorf("record %q: a recorded field must be non-empty, not reserved, and listed once, not the claimed field", f)
		}
		seen[f] = true
	}
	return nil
}

// CheckClaim reports whether Claim's arguments are well-formed: field
// non-empty and without the reserved "__" prefix, lease >= 1 ms,
// maxAttempts >= 1. Every StateStore refuses what it refuses, with its
// error wrapped; other implementations (relaytest's) call it for that.
func CheckClaim(field string, lease time.Duration, maxAttempts int) error {
	if err := CheckField(field); err != nil {
		return err
	}
	if lease < time.Millisecond {
		return fmt.Errorf("lease %v: must be >= 1ms", lease)
	}
	if maxAttempts < 1 {
		return fmt.Errorf("max attempts %d: must be >= 1", maxAttempts)
	}
	return nil
}

// CheckField reports whether field can name an invocation: non-empty and
// without the reserved "__" prefix. Every StateStore refuses what it
// refuses.
func CheckField(field string) error {
	switch {
	case field == "":
		return errors.New("empty field")
	case strings.HasPrefix(field, "__"):
		return fmt.Errorf("field %q: the __ prefix is reserved", field)
	}
	return nil
}

// CheckToken reports whether token can fence a lease: non-empty, without
// ':' (the separator of a lease's hash value).
func CheckToken(token string) error {
	if token == "" || strings.Contains(token, ":") {
		return fmt.Errorf("token %q: must be non-empty without ':'", token)
	}
	return nil
}

// Check reports whether l is well-formed for a transition: a field as
// CheckClaim wants it, Attempt >= 1 and a token as CheckToken wants it.
// Every StateStore refuses a malformed lease before touching state.
func (l Lease) Check() error {
	if err := CheckField(l.Field); err != nil {
		return err
	}
	if l.Attempt < 1 {
		return fmt.Errorf("lease attempt %d: must be >= 1", l.Attempt)
	}
	return CheckToken(l.Token)
}
