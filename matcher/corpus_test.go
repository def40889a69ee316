package matcher_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

// corpusCase is one entry of testdata/cases/*.yaml. pattern is YAML text,
// parsed with yamlpattern.Parse, so error positions are relative to it. An
// error is written "line:col: message fragment".
type corpusCase struct {
	Name    string   `yaml:"name"`
	Spec    string   `yaml:"spec"`    // the documented rule the case checks, if any
	Pattern string   `yaml:"pattern"` // YAML text
	Now     string   `yaml:"now"`     // RFC 3339; default corpusNow
	Match   []string `yaml:"match"`   // events (JSON) that match
	NoMatch []string `yaml:"nomatch"` // events (JSON) that do not
	Errors  []string `yaml:"errors"`  // expected parse errors, in order
}

// corpusNow is the match time of every corpus case without its own now.
const corpusNow = "2026-09-12T10:00:00Z"

func loadCorpus(t testing.TB) map[string][]corpusCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "cases", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no corpus files in testdata/cases")
	}
	out := make(map[string][]corpusCase)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cases []corpusCase
		if err := yaml.UnmarshalWithOptions(b, &cases, yaml.DisallowUnknownField()); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = cases
	}
	return out
}

func TestCorpus(t *testing.T) {
	for file, cases := range loadCorpus(t) {
		t.Run(strings.TrimSuffix(file, ".yaml"), func(t *testing.T) {
			seen := make(map[string]bool)
			for _, c := range cases {
				if c.Name == "" || seen[c.Name] {
					t.Fatalf("case %q: names must be present and unique", c.Name)
				}
				seen[c.Name] = true
				t.Run(c.Name, func(t *testing.T) { runCorpusCase(t, c) })
			}
		})
	}
}

func runCorpusCase(t *testing.T, c corpusCase) {
	t.Helper()
	if (len(c.Errors) > 0) == (len(c.Match)+len(c.NoMatch) > 0) {
		t.Fatal("a case lists either errors or match/nomatch events")
	}
	now := mustTime(t, cmpOr(c.Now, corpusNow))
	p, err := yamlpattern.Parse("case.yaml", []byte(c.Pattern))
	if len(c.Errors) > 0 {
		checkErrors(t, err, c.Errors)
		return
	}
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	for _, ev := range c.Match {
		if !match(t, p, ev, now) {
			t.Errorf("pattern %s\ndoes not match %s", p, ev)
		}
	}
	for _, ev := range c.NoMatch {
		if match(t, p, ev, now) {
			t.Errorf("pattern %s\nmatches %s", p, ev)
		}
	}
	// The canonical form parses back to an equivalent pattern.
	q, err := yamlpattern.Parse("canonical.yaml", []byte(p.String()))
	if err != nil {
		t.Fatalf("Parse(String()) = %v; String() = %s", err, p)
	}
	if diff := cmp.Diff(p.String(), q.String()); diff != "" {
		t.Errorf("String round trip (-want +got):\n%s", diff)
	}
	for _, ev := range append(c.Match, c.NoMatch...) {
		if match(t, p, ev, now) != match(t, q, ev, now) {
			t.Errorf("canonical pattern %s disagrees on %s", q, ev)
		}
	}
}

func match(t *testing.T, p *matcher.Pattern, event string, now time.Time) bool {
	t.Helper()
	v, err := matcher.DecodeEvent([]byte(event))
	if err != nil {
		t.Fatalf("DecodeEvent(%s): %v", event, err)
	}
	return p.MatchValue(v, now)
}

// checkErrors compares err, an ErrorList, with want entries written
// "line:col: fragment".
func checkErrors(t *testing.T, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Parse succeeded, want errors %q", want)
	}
	list, ok := err.(matcher.ErrorList)
	if !ok {
		t.Fatalf("error %T %v, want matcher.ErrorList", err, err)
	}
	var gotPos, wantPos []string
	for _, e := range list {
		gotPos = append(gotPos, fmt.Sprintf("%d:%d", e.Line, e.Col))
	}
	for _, w := range want {
		lc, _, _ := strings.Cut(w, ": ")
		wantPos = append(wantPos, lc)
	}
	if diff := cmp.Diff(wantPos, gotPos); diff != "" {
		t.Fatalf("error positions (-want +got):\n%s\nerrors:\n%s", diff, formatList(list))
	}
	for i, w := range want {
		_, frag, _ := strings.Cut(w, ": ")
		if !strings.Contains(list[i].Msg, frag) {
			t.Errorf("error %d = %q, want it to contain %q", i, list[i].Msg, frag)
		}
	}
}

func formatList(l matcher.ErrorList) string {
	var b strings.Builder
	for _, e := range l {
		b.WriteString("  " + e.Error() + "\n")
	}
	return b.String()
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
