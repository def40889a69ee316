package matcher_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
)

// The decoder of Set.Match builds only the values under the paths some rule
// references. These tests hold it to DecodeEvent, the reference: it accepts
// exactly the texts DecodeEvent accepts, and what it builds is DecodeEvent's
// result cut down to the referenced paths (prune).

// scanCases are texts at the edges of what DecodeEvent accepts; each is
// checked by TestDecodeReferenced and seeds FuzzDecodeReferenced.
var scanCases = []string{
	// Accepted.
	`{}`, ` {} `, "\t\r\n{\"a\":1}\n", `{"a":{}}`, `{"a":[]}`, `{"a":[[],[[]]]}`,
	`{"a":1,"a":2}`, `{"a":{"b":1,"c":2},"a":{"c":3}}`, `{"a":[1,{"b":2}],"a":"x"}`,
	`{"a":1,"\u0061":2}`, `{"\u0061":{"b":1},"a\u0000":3}`, `{"a\"b":1,"a\\b":2,"a/b":3,"a\/b":4}`,
	`{"s":"\b\f\n\r\t\"\\\/"}`, `{"s":"\u00e9\u00E9é"}`, `{"s":"\ud83d\ude00"}`, `{"s":"\ud83d"}`,
	`{"s":"\ude00\ud83d"}`, `{"s":"\ud83d\ud83d\ude00"}`, `{"s":"\ud83dx\ude00"}`, `{"s":"\ud83d\u0041"}`,
	`{"s":"\u0000\u001f\u007f"}`, "{\"s\":\"\x7f\"}", "{\"s\":\"𝄞 中文 \ufeff\"}", `{"e":"😀"}`,
	`{"n":0,"m":-0,"o":-0.0,"p":1.5e10,"q":1E-2,"r":1e+2,"t":9007199254740993}`,
	`{"n":123456789012345678901234567890e-999999999999}`, `{"b":true,"c":false,"d":null}`,
	`{"a":[true,false,null,"x",1,{"b":[{"c":1}]}]}`,
	`{"s":"[[[{{\"[["}`, `{"s":"}","t":"]"}`,
	// Rejected.
	``, ` `, `null`, `[]`, `"{}"`, `1`, `true`, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,"a":1}`,
	`{"a":1 "b":2}`, `{a:1}`, `{'a':1}`, `{"a":1}{}`, `{"a":1} x`, `{"a":1}}`, `{"a":1},`, "{}\x00",
	"\ufeff{}", "{}\v", "\f{}", `{"a":[1,]}`, `{"a":[,1]}`, `{"a":[1 2]}`, `{"a":[}`, `{"a":{]}`,
	`{"a":tru}`, `{"a":truex}`, `{"a":nul}`, `{"a":nulll}`, `{"a":False}`, `{"a":NaN}`, `{"a":Infinity}`,
	`{"a":01}`, `{"a":-01}`, `{"a":+1}`, `{"a":.5}`, `{"a":1.}`, `{"a":1.e5}`, `{"a":1e}`, `{"a":1e+}`,
	`{"a":-}`, `{"a":0x10}`, `{"a":1_000}`, `{"a":--1}`,
	`{"s":"\x"}`, `{"s":"\u12"}`, `{"s":"\u12g4"}`, `{"s":"\U0041"}`, `{"s":"\'"}`, `{"s":"abc}`,
	"{\"s\":\"a\tb\"}", "{\"s\":\"a\nb\"}", "{\"s\":\"\x00\"}", "{\"s\":\"\x1f\"}",
	"{\"s\":\"ok \xff\xfe\"}", "{\"s\":\"\xed\xa0\x80\"}", "{\"s\":\"\xc0\xaf\"}", "{\"s\":\"\xf4\x90\x80\x80\"}",
	"{\"s\":\"\xe2\x82\"}", "{\"\xff\":1}", "{\"a\":1}\xff", "\xff{}", "{\"a\":\"\x80\"}",
	`{"a":1` + strings.Repeat(" ", 9),
	// Depth: MaxEventDepth levels are accepted, one more is not.
	`{"a":` + strings.Repeat("[", matcher.MaxEventDepth-1) + strings.Repeat("]", matcher.MaxEventDepth-1) + `}`,
	`{"a":` + strings.Repeat("[", matcher.MaxEventDepth) + strings.Repeat("]", matcher.MaxEventDepth) + `}`,
	`{"a":` + strings.Repeat(`{"a":`, matcher.MaxEventDepth-1) + `1` + strings.Repeat("}", matcher.MaxEventDepth-1) + `}`,
	`{"a":` + strings.Repeat(`{"a":`, matcher.MaxEventDepth) + `1` + strings.Repeat("}", matcher.MaxEventDepth) + `}`,
	`{"b":` + strings.Repeat(`[{"b":`, 300) + `1` + strings.Repeat("}]", 300) + `}`,
}

// scanPaths are the fixed paths FuzzDecodeReferenced decodes besides those
// of the event itself.
var scanPaths = [][]string{{"a"}, {"a", "b"}, {"a", "b", "c"}, {"b"}, {"b", "b"}, {"s"}, {"e"}, {"n"}, {"k"}, {"t"}, {"a\u0000"}}

func TestDecodeReferenced(t *testing.T) {
	accepted := 0
	for _, ev := range scanCases {
		if checkDecodeReferenced(t, []byte(ev)) {
			accepted++
		}
	}
	if accepted < 20 || accepted > len(scanCases)-40 {
		t.Errorf("%d of %d cases accepted: the table has lost its balance", accepted, len(scanCases))
	}
}

func FuzzDecodeReferenced(f *testing.F) {
	for _, ev := range scanCases {
		f.Add([]byte(ev))
	}
	addCorpusSeeds(f, func(_, ev string) { f.Add([]byte(ev)) })
	f.Fuzz(func(t *testing.T, event []byte) { checkDecodeReferenced(t, event) })
}

// checkDecodeReferenced checks the decoder against DecodeEvent on event,
// for no paths, the fixed scanPaths, every path of the event and every
// other one, and reports whether event is well-formed.
func checkDecodeReferenced(t *testing.T, event []byte) bool {
	t.Helper()
	full, err := matcher.DecodeEvent(event)
	if _, ok := matcher.DecodePaths(event, nil); ok != (err == nil) {
		t.Fatalf("%q: the decoder's verdict (well-formed %v) differs from DecodeEvent's (error %v)", event, ok, err)
	}
	pathSets := [][][]string{scanPaths}
	if err == nil {
		all := eventPaths(full, nil, nil)
		var half [][]string
		for i, p := range all {
			if i%2 == 0 {
				half = append(half, p)
			}
		}
		pathSets = append(pathSets, all, half)
	}
	for _, paths := range pathSets {
		got, ok := matcher.DecodePaths(event, paths)
		if ok != (err == nil) {
			t.Fatalf("%q with paths %q: the decoder's verdict (well-formed %v) differs from DecodeEvent's (error %v)", event, paths, ok, err)
		}
		if !ok {
			continue
		}
		if want := prune(full, trieOf(paths)); !reflect.DeepEqual(want, any(got)) {
			t.Fatalf("%q with paths %q: decoded values differ from DecodeEvent's (-want +got):\n%s", event, paths, cmp.Diff(want, any(got)))
		}
	}
	return err == nil
}

// trie is a set of field paths.
type trie map[string]trie

func trieOf(paths [][]string) trie {
	root := trie{}
	for _, p := range paths {
		n := root
		for _, name := range p {
			if n[name] == nil {
				n[name] = trie{}
			}
			n = n[name]
		}
	}
	return root
}

// prune returns what the decoder of Set.Match is to build of a value v
// that DecodeEvent built, at a path whose children are t: objects keep the
// keys in t, arrays every element, each cut down the same way.
func prune(v any, t trie) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, c := range t {
			if e, ok := v[k]; ok {
				out[k] = prune(e, c)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = prune(e, t)
		}
		return out
	}
	return v
}

// eventPaths appends every field path of v under prefix.
func eventPaths(v any, prefix []string, out [][]string) [][]string {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			p := append(prefix[:len(prefix):len(prefix)], k)
			out = eventPaths(e, p, append(out, p))
		}
	case []any:
		for _, e := range v {
			out = eventPaths(e, prefix, out)
		}
	}
	return out
}

// checkSetDecode checks, for FuzzMatch, what Set.Match decodes of event
// against DecodeEvent's full (nil on err): the same verdict, the same
// error, and the referenced part of full.
func checkSetDecode(t *testing.T, set *matcher.Set, event []byte, full map[string]any, err error, now time.Time) {
	t.Helper()
	got, ok := set.DecodeReferenced(event)
	if ok != (err == nil) {
		t.Fatalf("%q: Set.Match's decoder says well-formed %v, DecodeEvent says error %v", event, ok, err)
	}
	if err != nil {
		targets, merr := set.MatchAt(event, now)
		if !errors.Is(merr, matcher.ErrMalformed) || merr.Error() != err.Error() || targets != nil {
			t.Fatalf("%q: Set.MatchAt = %v, %v; want no targets and DecodeEvent's error %v", event, targets, merr, err)
		}
		return
	}
	if want := prune(full, trieOf(set.ReferencedPaths())); !reflect.DeepEqual(want, any(got)) {
		t.Fatalf("%q: Set.Match's decoder differs from DecodeEvent on the referenced paths (-want +got):\n%s", event, cmp.Diff(want, any(got)))
	}
}
