package matcher_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

// addCorpusSeeds adds every corpus pattern (and, through add, its events).
func addCorpusSeeds(f *testing.F, add func(pattern, event string)) {
	for _, cases := range loadCorpus(f) {
		for _, c := range cases {
			if len(c.Match)+len(c.NoMatch) == 0 {
				add(c.Pattern, `{}`)
			}
			for _, ev := range append(c.Match, c.NoMatch...) {
				add(c.Pattern, ev)
			}
		}
	}
}

// FuzzParse checks that Parse never panics, that every error carries a
// position, and that an accepted pattern survives a String round trip.
func FuzzParse(f *testing.F) {
	addCorpusSeeds(f, func(p, _ string) { f.Add(p) })
	f.Add("a: [{prefix: x}, &a b, *a]")
	f.Add("? [a]\n: [b]")
	f.Add("a: !!str\nb: !!map")
	f.Add("a: [[[[[[]]]]]]")
	f.Fuzz(func(t *testing.T, src string) {
		p, err := yamlpattern.Parse("fuzz.yaml", []byte(src))
		if err != nil {
			if p != nil {
				t.Fatalf("pattern %v returned with error %v", p, err)
			}
			var list matcher.ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T %v is not a non-empty ErrorList", err, err)
			}
			for _, e := range list {
				if e.File != "fuzz.yaml" || e.Line < 1 || e.Col < 1 || e.Msg == "" {
					t.Fatalf("error without position or message: %#v", e)
				}
			}
			return
		}
		canon := p.String()
		q, err := yamlpattern.Parse("canonical.yaml", []byte(canon))
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", canon, src, err)
		}
		if q.String() != canon {
			t.Fatalf("canonical form is not stable:\n%q\n%q", canon, q.String())
		}
	})
}

// FuzzMatch checks that matching never panics, that the canonical form of a
// pattern and a Set agree with the pattern itself, and that a Set, which
// decodes only what its rules reference, takes the event for malformed
// exactly when DecodeEvent does (with its error) and decodes the same
// values.
func FuzzMatch(f *testing.F) {
	addCorpusSeeds(f, func(p, ev string) { f.Add(p, ev) })
	f.Add("a: {b: [{exists: false}]}", `{"a":[[],[{"b":1}],null]}`)
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	always, err := yamlpattern.Parse("always.yaml", []byte("x: [{exists: true}, {exists: false}]"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, pattern, event string) {
		p, err := yamlpattern.Parse("fuzz.yaml", []byte(pattern))
		if err != nil {
			return
		}
		// In a Set the pattern is indexed or scanned; either way the Set must
		// agree with MatchValue. The Set decodes only the paths its rules
		// reference; that must agree with DecodeEvent.
		set := matcher.NewSet([]matcher.Rule{
			{App: "a", Handler: "h.f", Pattern: p},
			{App: "a", Handler: "h.g", Pattern: always},
		})
		ev, err := matcher.DecodeEvent([]byte(event))
		checkSetDecode(t, set, []byte(event), ev, err, now)
		if err != nil {
			if !errors.Is(err, matcher.ErrMalformed) {
				t.Fatalf("DecodeEvent error %v does not wrap ErrMalformed", err)
			}
			return
		}
		got := p.MatchValue(ev, now)
		q, err := yamlpattern.Parse("canonical.yaml", []byte(p.String()))
		if err != nil {
			t.Fatalf("canonical form %q does not parse: %v", p.String(), err)
		}
		if q.MatchValue(ev, now) != got {
			t.Fatalf("canonical form %q disagrees on %s", p.String(), event)
		}
		targets, err := set.MatchAt([]byte(event), now)
		want := []matcher.Target{{App: "a", Handler: "h.g", Rule: 1}}
		if got {
			want = append([]matcher.Target{{App: "a", Handler: "h.f", Rule: 0}}, want...)
		}
		if err != nil || !slices.Equal(targets, want) {
			t.Fatalf("Set.MatchAt = %v, %v; want %v", targets, err, want)
		}
	})
}
