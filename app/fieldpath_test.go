package app_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
)

func TestParseFieldPath(t *testing.T) {
	for in, want := range map[string][]string{
		"id":                    {"id"},
		"new_image.customer_id": {"new_image", "customer_id"},
		`a\.b.c`:                {"a.b", "c"},
		`a\\b`:                  {`a\b`},
		`a\\.b`:                 {`a` + `\`, "b"},
		`\.`:                    {"."},
		`a\..b`:                 {"a.", "b"},
		"prefix.exists":         {"prefix", "exists"},
		"é.ü":                   {"é", "ü"},
		"1.2":                   {"1", "2"},
	} {
		p, err := app.ParseFieldPath(in)
		if err != nil {
			t.Errorf("ParseFieldPath(%q): %v", in, err)
			continue
		}
		if diff := cmp.Diff(want, p.Keys()); diff != "" {
			t.Errorf("%q.Keys() (-want +got):\n%s", in, diff)
		}
		if back := app.FieldPathOf(p.Keys()...); back != p {
			t.Errorf("FieldPathOf(%q.Keys()...) = %q", in, back)
		}
	}
	for in, want := range map[string]string{
		"":          "field path is empty",
		".a":        `field path ".a": key 1 is empty`,
		"a.":        `field path "a.": key 2 is empty`,
		"a..b":      `field path "a..b": key 2 is empty`,
		"a b":       "contains whitespace",
		"a\tb":      "contains whitespace",
		"a\x00b":    "control character",
		`\prefix`:   `a backslash escapes only a dot (\.) or a backslash (\\)`,
		`a\`:        "a backslash escapes only",
		`new\_name`: "a backslash escapes only",
	} {
		if _, err := app.ParseFieldPath(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseFieldPath(%q) = %v, want an error containing %q", in, err, want)
		}
	}
	if got := app.FieldPath("").Keys(); got != nil {
		t.Errorf("empty path has keys %q", got)
	}
}

func hashed(s string) string {
	sum := sha256.Sum256([]byte(s))
	return app.HashedKeyPrefix + hex.EncodeToString(sum[:])
}

func TestKeyOf(t *testing.T) {
	long := strings.Repeat("x", app.MaxKeyBytes+1)
	fill := `"pad":{"a":[1,{"b":"}"}],"s":"\"{["},"n":null,`
	for _, c := range []struct {
		name, event string
		path        app.FieldPath
		want        string
	}{
		{"top-level string", `{"id":"c-42"}`, "id", "c-42"},
		{"nested", `{"event_name":"INSERT","new_image":{"customer_id":"c-7","x":1}}`, "new_image.customer_id", "c-7"},
		{"nested after other values", `{` + fill + `"new_image":{` + fill + `"customer_id":"c-7"}}`, "new_image.customer_id", "c-7"},
		{"whitespace", " \n{ \"new_image\" : { \"id\" :\t\"a\" } }\n", "new_image.id", "a"},
		{"escaped dot", `{"a.b":{"c":"dot"},"a":{"b":{"c":"nested"}}}`, `a\.b.c`, "dot"},
		{"unescaped dot is a path", `{"a.b":{"c":"dot"},"a":{"b":{"c":"nested"}}}`, "a.b.c", "nested"},
		{"escaped backslash", `{"a\\b":"bs"}`, `a\\b`, "bs"},
		{"operator name", `{"prefix":"p"}`, "prefix", "p"},
		{"escapes in the value", `{"id":"a\u0062\n\"c"}`, "id", "ab\n\"c"},
		{"escapes in the key", `{"\u0069d":"found"}`, "id", "found"},
		{"integer", `{"n":42}`, "n", "42"},
		{"number as written", `{"n":7.0}`, "n", "7.0"},
		{"negative exponent", `{"n":-1.5e-3}`, "n", "-1.5e-3"},
		{"number and string share", `{"n":"7"}`, "n", "7"},
		{"true", `{"b":true}`, "b", "true"},
		{"false", `{"b":false}`, "b", "false"},
		{"missing", `{"a":1}`, "b", ""},
		{"missing nested", `{"a":{"c":1}}`, "a.b", ""},
		{"null", `{"a":null}`, "a", ""},
		{"empty string", `{"a":""}`, "a", ""},
		{"object", `{"a":{"b":1}}`, "a", ""},
		{"array", `{"a":[1,2]}`, "a", ""},
		{"through an array", `{"a":[{"b":1}]}`, "a.b", ""},
		{"through a string", `{"a":"b"}`, "a.b", ""},
		{"through null", `{"a":null}`, "a.b", ""},
		{"empty path", `{"a":"b"}`, "", ""},
		{"last duplicate wins", `{"a":"first","a":"last"}`, "a", "last"},
		{"last duplicate wins whole", `{"a":{"b":"first"},"a":{"c":1}}`, "a.b", ""},
		{"later duplicate nested", `{"a":{"b":"first"},"x":0,"a":{"b":"second"}}`, "a.b", "second"},
		{"duplicate inside", `{"a":{"b":"first","b":"second"}}`, "a.b", "second"},
		{"long value hashed", `{"a":"` + long + `"}`, "a", hashed(long)},
		{"value of MaxKeyBytes kept", `{"a":"` + long[1:] + `"}`, "a", long[1:]},
		{"prefix hashed", `{"a":"sha256:abc"}`, "a", hashed("sha256:abc")},
		{"not an object", `["a"]`, "0", ""},
		{"truncated", `{"a":"b"`, "a", ""},
		{"truncated string", `{"a":"b`, "a", ""},
		{"unbalanced", `{"x":[1},"a":"b"}`, "a", ""},
		{"bad escape", `{"a":"\q"}`, "a", ""},
		{"garbage value", `{"a":xyz}`, "a", ""},
		{"empty", ``, "a", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := app.KeyOf([]byte(c.event), c.path); got != c.want {
				t.Errorf("KeyOf(%.80s, %q) = %q, want %q", c.event, c.path, got, c.want)
			}
		})
	}
}

// TestKeyOfHugeEvent: a key is found at either end of a 1 MiB event, as
// the matcher reads the same text.
func TestKeyOfHugeEvent(t *testing.T) {
	ev := hugeEvent(1 << 20)
	if len(ev) < 1<<20 {
		t.Fatalf("event is %d bytes", len(ev))
	}
	for path, want := range map[app.FieldPath]string{"new_image.customer_id": "c-42", "tail.id": "the-end", "new_image.items": ""} {
		if got := app.KeyOf(ev, path); got != want {
			t.Errorf("KeyOf(%s) = %q, want %q", path, got, want)
		}
		if ref := refKeyOf(t, ev, path); ref != want {
			t.Errorf("reference key of %s = %q, want %q", path, ref, want)
		}
	}
}

// hugeEvent returns an event of about size bytes: a customer id first, a
// large array of objects, and a field at the end.
func hugeEvent(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"event_name":"INSERT","new_image":{"customer_id":"c-42","items":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"sku":"sku-%d","qty":%d,"note":"a \"quoted\" note {not [nested]}","tags":["a","b"],"more":{"x":null,"y":[true,false]}}`, i, i)
	}
	b.WriteString(`]},"tail":{"id":"the-end"}}`)
	return []byte(b.String())
}

// refKeyOf is KeyOf by its definition, on the event the matcher decodes.
func refKeyOf(t testing.TB, event []byte, path app.FieldPath) string {
	obj, err := matcher.DecodeEvent(event)
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	keys := path.Keys()
	if len(keys) == 0 {
		return ""
	}
	var v any = obj
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	var text string
	switch x := v.(type) {
	case string:
		text = x
	case json.Number:
		text = string(x)
	case bool:
		text = fmt.Sprint(x)
	default:
		return ""
	}
	if len(text) > app.MaxKeyBytes || strings.HasPrefix(text, app.HashedKeyPrefix) {
		return hashed(text)
	}
	return text
}

// FuzzKeyOf: on every event the matcher accepts, KeyOf gives the key its
// definition does; on any other text it does not panic.
func FuzzKeyOf(f *testing.F) {
	for _, s := range []string{`{"a":{"b":"x"}}`, `{"a":1,"a":{"b":[1,{"c":"}"}]}}`, `{"a\\.b":"y","a":{"b":true}}`, `{"a":{"b":"\u00e9\"\\"}}`, `{"a":null}`, `{}`} {
		f.Add([]byte(s), "a.b")
		f.Add([]byte(s), `a\.b`)
		f.Add([]byte(s), "a")
	}
	f.Fuzz(func(t *testing.T, event []byte, path string) {
		p, err := app.ParseFieldPath(path)
		if err != nil {
			p = app.FieldPath(path) // KeyOf must survive any path too
		}
		got := app.KeyOf(event, p)
		if err != nil {
			return
		}
		if _, derr := matcher.DecodeEvent(event); derr != nil {
			return
		}
		if want := refKeyOf(t, event, p); got != want {
			t.Errorf("KeyOf(%q, %q) = %q, want %q", event, path, got, want)
		}
	})
}

func BenchmarkKeyOf(b *testing.B) {
	for _, c := range []struct {
		name string
		size int
		path app.FieldPath
	}{
		{"1KiB", 1 << 10, "new_image.customer_id"},
		{"1MiB", 1 << 20, "new_image.customer_id"},
		{"1MiB/last", 1 << 20, "tail.id"},
	} {
		ev := hugeEvent(c.size)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(ev)))
			for b.Loop() {
				if app.KeyOf(ev, c.path) == "" {
					b.Fatal("no key")
				}
			}
		})
	}
}
