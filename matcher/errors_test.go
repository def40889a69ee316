package matcher_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
)

func TestPosErrorError(t *testing.T) {
	tests := []struct {
		name string
		err  matcher.PosError
		want string
	}{
		{"full", matcher.PosError{File: "orders/template.yaml", Line: 3, Col: 14, Path: "events[0].pattern.id[0]", Msg: `unknown operator "prefx"`},
			`orders/template.yaml:3:14: events[0].pattern.id[0]: unknown operator "prefx"`},
		{"no path", matcher.PosError{File: "a.yaml", Line: 1, Col: 2, Msg: "m"}, "a.yaml:1:2: m"},
		{"no position", matcher.PosError{File: "a.yaml", Path: "p", Msg: "m"}, "a.yaml: p: m"},
		{"no file", matcher.PosError{Line: 1, Col: 2, Path: "p", Msg: "m"}, "1:2: p: m"},
		{"message only", matcher.PosError{Msg: "m"}, "m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.err.Error()); diff != "" {
				t.Errorf("Error() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestErrorList(t *testing.T) {
	var l matcher.ErrorList
	if l.Err() != nil {
		t.Fatalf("empty list Err() = %v, want nil", l.Err())
	}
	if got := l.Error(); got != "no errors" {
		t.Errorf("empty Error() = %q", got)
	}
	l.Add("b.yaml", 1, 1, "", "b1")
	l.Add("a.yaml", 9, 1, "x", "a9")
	l.Add("a.yaml", 2, 7, "", "a2.7 first")
	l.Add("a.yaml", 2, 3, "", "a2.3")
	l.Add("a.yaml", 2, 7, "", "a2.7 second")
	l.Sort()
	var got []string
	for _, e := range l {
		got = append(got, e.Msg)
	}
	want := []string{"a2.3", "a2.7 first", "a2.7 second", "a9", "b1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sorted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("a.yaml:2:3: a2.3 (and 4 more errors)", l.Error()); diff != "" {
		t.Errorf("Error() (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("a.yaml:2:3: a2.3", l[:1].Error()); diff != "" {
		t.Errorf("single Error() (-want +got):\n%s", diff)
	}

	err := fmt.Errorf("load orders: %w", l.Err())
	var list matcher.ErrorList
	if !errors.As(err, &list) || len(list) != 5 {
		t.Errorf("errors.As(ErrorList) = %v, %d errors", list, len(list))
	}
	var pe *matcher.PosError
	if !errors.As(err, &pe) || pe.Msg != "a2.3" {
		t.Errorf("errors.As(*PosError) = %v, want the first error", pe)
	}
}
