package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/internal/testutil"
)

var (
	entryLinkRE = regexp.MustCompile(`/dlq/entry\?back=[^"]*id=([0-9]+-[0-9]+)`)
	relRE       = regexp.MustCompile(`<a href="([^"]+)" rel="(first|prev|next|last)">`)
)

// pageIDs returns the entry ids a list page links, in order, and its
// pager links by rel.
func pageIDs(body string) ([]string, map[string]string) {
	var ids []string
	for _, m := range entryLinkRE.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	links := map[string]string{}
	for _, m := range relRE.FindAllStringSubmatch(body, -1) {
		links[m[2]] = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	return ids, links
}

// TestDLQThousands pages 2,000 dead letters newest first, both ways and
// to the last page, with a filter kept by every link and counted in the
// heading, and jumps to an entry by its id or its original message id.
func TestDLQThousands(t *testing.T) {
	f := newFixture(t)
	ids := f.FillDLQ(2000)
	s := url.QueryEscape(f.Stream)
	_, body := f.get("/dlq?size=100&stream=" + s)
	got, links := pageIDs(body)
	if len(got) != 100 || got[0] != ids[1999] || got[99] != ids[1900] {
		t.Fatalf("first page: %d entries from %v, want the newest 100", len(got), got[:min(2, len(got))])
	}
	contains(t, "first page", body, "2\u202f000 entries</span>")
	if links["first"] != "" || links["prev"] != "" || links["next"] == "" || links["last"] == "" {
		t.Errorf("first page's pager: %v", links)
	}
	_, body = f.get(links["next"])
	page2, links2 := pageIDs(body)
	if len(page2) != 100 || page2[0] != ids[1899] {
		t.Errorf("second page starts at %v, want %s", page2[:1], ids[1899])
	}
	_, body = f.get(links2["prev"])
	if back, _ := pageIDs(body); strings.Join(back, " ") != strings.Join(got, " ") {
		t.Errorf("previous of the second page is not the first page")
	}
	_, body = f.get(links["last"])
	last, lastLinks := pageIDs(body)
	if len(last) != 100 || last[0] != ids[99] || last[99] != ids[0] || lastLinks["next"] != "" || lastLinks["prev"] == "" {
		t.Errorf("last page: %d entries from %v to %v, links %v; want the oldest 100, newest first", len(last), last[:1], last[len(last)-1:], lastLinks)
	}

	// A filter: handler prefix in another case, and an age range.
	_, body = f.get("/dlq?size=20&handler=REFUNDS&stream=" + s)
	got, links = pageIDs(body)
	contains(t, "filtered", body, "500 entries match (of 2\u202f000)")
	if len(got) != 20 || got[0] != ids[1999] {
		t.Errorf("filtered page: %v...", got[:min(1, len(got))])
	}
	for rel, l := range links {
		if !strings.Contains(l, "handler=REFUNDS") || !strings.Contains(l, "size=20") {
			t.Errorf("%s link %q drops the filter", rel, l)
		}
	}
	for _, m := range regexp.MustCompile(`href="(/dlq/entry\?[^"]+)"`).FindAllStringSubmatch(body, 3) {
		_, entry := f.get(strings.ReplaceAll(m[1], "&amp;", "&"))
		contains(t, "entry from a filtered list", entry, `class="back"`, "handler=REFUNDS")
	}
	_, body = f.get("/dlq?newer=" + url.QueryEscape("100s") + "&app=shop&order=oldest&stream=" + s)
	contains(t, "age range", body, "50 entries match (of 2\u202f000)")
	_, body = f.get("/dlq?text=C_1999&stream=" + s)
	if got, _ := pageIDs(body); len(got) != 1 || got[0] != ids[1998] {
		t.Errorf("event text search: %v, want [%s]", got, ids[1998])
	}
	contains(t, "event text search", body, "1 entry matches", "10\u202f000")

	// The search box: an entry id, an original message id.
	for q, want := range map[string]string{ids[5]: ids[5], "1500-7": ids[1499]} {
		code, _ := f.get("/dlq?q=" + q + "&stream=" + s)
		if code != http.StatusSeeOther || !strings.Contains(f.Location, "id="+want) {
			t.Errorf("search %s: status %d to %q, want the entry %s", q, code, f.Location, want)
		}
	}
	if code, body := f.get("/dlq?q=9-9&stream=" + s); code != http.StatusNotFound || !strings.Contains(body, "newest 10\u202f000") {
		t.Errorf("search for an unknown id: status %d", code)
	}
}

// waitJob follows a bulk action's page until it finishes, and returns it.
func (f *fixture) waitJob(jobURL string) string {
	f.T.Helper()
	var body string
	testutil.WaitFor(f.T, 60*time.Second, "the bulk action to finish", func() bool {
		_, body = f.get(jobURL)
		return strings.Contains(body, `<span class="badge good">finished</span>`)
	})
	return body
}

// TestDLQReplayAllMatching replays the 500 entries of 2,000 that a filter
// selects, after a confirmation with the exact count, in the background;
// a remove of all that match is stopped part way; read-only refuses both.
func TestDLQReplayAllMatching(t *testing.T) {
	f := newFixture(t)
	ids := f.FillDLQ(2000)
	f.Failing.Store(false)
	filter := url.Values{"app": {"shop"}, "handler": {"refunds"}, "action": {"replay"}}
	code, body := f.post("/dlq/bulk", filter)
	if code != http.StatusOK {
		t.Fatalf("bulk replay: status %d", code)
	}
	contains(t, "confirmation", body, `<b id="bulk-count">500</b>`, `name="count" value="500"`, `name="upto" value="`+ids[1999]+`"`,
		`entries with app &#34;shop&#34;, handler starting with &#34;refunds&#34;`)
	if f.Ran.Load() != 0 {
		t.Fatal("the confirmation ran handlers")
	}
	f.Publish(`{}`) // not a dead letter: nothing changes the count
	form := url.Values{"csrf": {f.csrf()}, "stream": {f.Stream}, "app": {"shop"}, "handler": {"refunds"}, "action": {"replay"},
		"count": {"500"}, "upto": {ids[1999]}, "confirm": {"yes"}}
	code, _ = f.do(http.MethodPost, "/dlq/bulk", form)
	if code != http.StatusSeeOther || !strings.HasPrefix(f.Location, "/dlq/job?") {
		t.Fatalf("confirmed bulk replay: status %d to %q", code, f.Location)
	}
	body = f.waitJob(f.Location)
	contains(t, "finished job", body, "Replay all matching: 500 of 500 done, 500 replayed")
	if n := f.Ran.Load(); n != 500 {
		t.Errorf("handlers ran %d times, want 500", n)
	}
	if n, _ := f.Store.Len(t.Context()); n != 1500 {
		t.Errorf("%d entries left, want 1500", n)
	}

	// Stop: a replay of all that match, held in its first handler, stops
	// after it.
	hold := make(chan struct{})
	f.Hold.Store(&hold)
	form = url.Values{"csrf": {f.csrf()}, "stream": {f.Stream}, "app": {"shop"}, "action": {"replay"}, "count": {"500"},
		"upto": {ids[1999]}, "confirm": {"yes"}}
	f.do(http.MethodPost, "/dlq/bulk", form)
	job := f.Location
	testutil.WaitFor(t, 10*time.Second, "the first replay to start", func() bool { return f.Ran.Load() == 501 })
	jobID := strings.TrimPrefix(regexp.MustCompile(`id=[0-9a-f]+`).FindString(job), "id=")
	if code, _ := f.post("/dlq/job/stop", url.Values{"id": {jobID}}); code != http.StatusSeeOther {
		t.Errorf("stop: status %d", code)
	}
	close(hold)
	body = f.waitJob(job)
	contains(t, "stopped job", body, "Replay all matching: 1 of 500 done, 1 replayed", "stopped on request")
	if n := f.Ran.Load(); n != 501 {
		t.Errorf("handlers ran %d times, want 501: the stop did not stop", n)
	}

	// Remove all that match.
	form = url.Values{"csrf": {f.csrf()}, "stream": {f.Stream}, "app": {"billing"}, "action": {"remove"}}
	_, body = f.do(http.MethodPost, "/dlq/bulk", form)
	contains(t, "remove confirmation", body, `<b id="bulk-count">1 000</b>`, "cannot be undone")
	form.Set("count", "1000")
	form.Set("upto", ids[1998])
	form.Set("confirm", "yes")
	f.do(http.MethodPost, "/dlq/bulk", form)
	body = f.waitJob(f.Location)
	contains(t, "bulk remove", body, "Remove all matching: 1000 of 1000 done, 1000 removed")
	if n, _ := f.Store.Len(t.Context()); n != 499 {
		t.Errorf("%d entries left, want 499 (shop, orders.charge)", n)
	}

	ro := newFixture(t, func(c *console.Config) { c.ReadOnly = true })
	if code, _ := ro.post("/dlq/bulk", url.Values{"action": {"remove"}}); code != http.StatusForbidden {
		t.Errorf("bulk remove read-only: status %d", code)
	}
}

// TestDLQJobEndsWithTheConsole: Close stops a replay of all matching
// after the entry it is on, and waits for it.
func TestDLQJobEndsWithTheConsole(t *testing.T) {
	f := newFixture(t)
	ids := f.FillDLQ(40)
	hold := make(chan struct{})
	f.Hold.Store(&hold)
	form := url.Values{"csrf": {f.csrf()}, "stream": {f.Stream}, "app": {"shop"}, "action": {"replay"}, "count": {"20"},
		"upto": {ids[39]}, "confirm": {"yes"}}
	f.do(http.MethodPost, "/dlq/bulk", form)
	job := f.Location
	testutil.WaitFor(t, 10*time.Second, "the first replay to start", func() bool { return f.Ran.Load() == 1 })
	closed := make(chan struct{})
	go func() { f.Server.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a replay of the job was running")
	case <-time.After(100 * time.Millisecond):
	}
	close(hold)
	<-closed
	_, body := f.get(job)
	contains(t, "job after Close", body, "Replay all matching: 1 of 20 done", "the console stopped")
	if n := f.Ran.Load(); n != 1 {
		t.Errorf("handlers ran %d times, want 1", n)
	}
}
