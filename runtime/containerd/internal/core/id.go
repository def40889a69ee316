package core

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// maxIDLen is containerd's limit on identifiers (pkg/identifiers).
const maxIDLen = 76

// ContainerID returns a new container (and snapshot) id for one attempt:
// "<app>-<handler>-<16 hex>", sanitised to containerd's identifier syntax,
// letters and digits separated by single '.', '_' or '-'.
func ContainerID(app, handler string) string {
	suffix := RandomHex(8)
	base := sanitizeID(app + "-" + handler)
	if max := maxIDLen - len(suffix) - 1; len(base) > max {
		base = strings.TrimRight(base[:max], "._-")
	}
	if base == "" {
		return suffix
	}
	return base + "-" + suffix
}

// sanitizeID maps s to containerd's identifier alphabet: runs of other
// characters become '-', separators never repeat or start or end the id.
func sanitizeID(s string) string {
	var sb strings.Builder
	sep := true // suppress a leading separator
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			sb.WriteRune(r)
			sep = false
		case !sep:
			if r == '.' || r == '_' {
				sb.WriteRune(r)
			} else {
				sb.WriteByte('-')
			}
			sep = true
		}
	}
	return strings.TrimRight(sb.String(), "._-")
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (Go 1.24+)
	return hex.EncodeToString(b)
}
