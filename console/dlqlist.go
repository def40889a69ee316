package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/stream"
)

// Dead-letter list settings (docs/console.md#pages).
const (
	// searchWindow is how many of the newest entries a payload text
	// search or an original-id search reads, and how many entries a
	// filtered count reads at most.
	searchWindow = 10_000
)

// pageSizes are the page sizes the dead-letter list offers.
var pageSizes = []int{20, 50, 100, 200, 500}

// dlqFilter is the dead-letter list's query: its filters, order and page
// size, carried by every link and form of the list so that none drops it.
type dlqFilter struct {
	Stream                                   string
	App, Handler, Reason, Text, Newer, Older string
	Oldest                                   bool // oldest first; newest first otherwise
	Size                                     int
}

// parseFilter reads the list's query from r (a GET query or a POST form).
func (s *Server) parseFilter(r *http.Request, st string) dlqFilter {
	f := dlqFilter{Stream: st, App: r.FormValue("app"), Handler: r.FormValue("handler"), Reason: r.FormValue("reason"),
		Text: r.FormValue("text"), Newer: r.FormValue("newer"), Older: r.FormValue("older"),
		Oldest: r.FormValue("order") == "oldest", Size: s.cfg.PageSize}
	if n, err := strconv.Atoi(r.FormValue("size")); err == nil && slices.Contains(pageSizes, n) {
		f.Size = n
	}
	return f
}

// Set reports whether any filter (not the order or size) is set.
func (f dlqFilter) Set() bool {
	return f.App != "" || f.Handler != "" || f.Reason != "" || f.Text != "" || f.Newer != "" || f.Older != ""
}

// URL is the list with this query and the extra key, value pairs:
// every link of the list keeps the filter.
func (f dlqFilter) URL(kv ...string) string {
	order := ""
	if f.Oldest {
		order = "oldest"
	}
	return query("/dlq", append([]string{"stream", f.Stream, "app", f.App, "handler", f.Handler, "reason", f.Reason,
		"text", f.Text, "newer", f.Newer, "older", f.Older, "order", order, "size", strconv.Itoa(f.Size)}, kv...)...)
}

// Toggle is the list in the other order, from its start.
func (f dlqFilter) Toggle() string {
	f.Oldest = !f.Oldest
	return f.URL()
}

// Shown is f with every value made safe to show.
func (f dlqFilter) shown() dlqFilter {
	for _, p := range []*string{&f.App, &f.Handler, &f.Reason, &f.Text, &f.Newer, &f.Older} {
		*p = clean(*p)
	}
	return f
}

// pageQuery turns f into the store's query; the error names the field.
func (f dlqFilter) pageQuery(now time.Time) (dlq.PageQuery, error) {
	q := dlq.PageQuery{Filter: dlq.Filter{App: f.App}, HandlerPrefix: f.Handler, Reason: f.Reason, Text: f.Text,
		Newest: !f.Oldest, Count: f.Size}
	var err error
	if q.Since, err = dlq.ParseAge(clean(f.Newer), now); err != nil {
		return q, errors.New("newer than: " + err.Error())
	}
	if q.Before, err = dlq.ParseAge(clean(f.Older), now); err != nil {
		return q, errors.New("older than: " + err.Error())
	}
	if f.Set() {
		// A filtered page reads as far as its count does, so a page of
		// the newest entries lists every match the count found, up to its
		// size, rather than stopping at DefaultPageScan entries.
		q.Scan = searchWindow
	}
	return q, nil
}

// excerptAround is how many bytes of the event an excerpt shows on each
// side of the match.
const excerptAround = 60

// excerpt is the part of a dead letter's event around the first match of
// the event-text filter, as the list shows it.
type excerpt struct {
	Before, Match, After string
	// Cut: there is more of the event before or after.
	CutBefore, CutAfter bool
}

// findExcerpt returns the text around text's first match in event,
// ignoring case as the filter does (dlq.PageQuery.Text); false when
// there is none.
func findExcerpt(event, text string) (excerpt, bool) {
	if text == "" {
		return excerpt{}, false
	}
	lower := strings.ToLower(event)
	i := strings.Index(lower, strings.ToLower(text))
	if i < 0 {
		return excerpt{}, false
	}
	if len(lower) != len(event) {
		event = lower // case folding changed lengths: show the folded text
	}
	j := i + len(text)
	from, to := runeStart(event, max(i-excerptAround, 0)), runeStart(event, min(j+excerptAround, len(event)))
	return excerpt{Before: clean(event[from:i]), Match: clean(event[i:j]), After: clean(event[j:to]),
		CutBefore: from > 0, CutAfter: to < len(event)}, true
}

// runeStart moves i back to the start of the rune it is in.
func runeStart(s string, i int) int {
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

type dlqRow struct {
	dlq.Entry
	Age     time.Duration
	Expires string
	// Excerpt is the event around the text filter's match, when it is set.
	Excerpt *excerpt
	// Problem is set for an entry that cannot be decoded; only its ID is
	// meaningful then.
	Problem string
}

type dlqView struct {
	Stream string
	Filter dlqFilter
	Sizes  []int
	Apps   []string // the apps to choose from
	Rows   []dlqRow
	// Matching is how many entries the filter selects (the whole queue
	// without one); AtLeast when the count stopped at searchWindow
	// entries read. Counted is false when it could not be read.
	Matching int64
	AtLeast  bool
	Counted  bool
	Total    int64 // the queue's length
	Window   int
	// The pager: Prev, Next and Last are the links shown, "" for none.
	Prev, Next, Last string
	First            bool // not on the first page: a link to it
	Scanned          int
	Short            bool // the scan budget ended the page before it was full
	ShortAt          string
	Problem          string
	Here             string // this page's URL, for the way back from an entry
}

func (s *Server) dlqList(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	now := time.Now()
	f := s.parseFilter(r, st)
	v := dlqView{Stream: st, Filter: f.shown(), Sizes: pageSizes, Window: searchWindow, Here: localPath(r.URL.RequestURI())}
	if apps, err := s.cfg.Apps.Load(r.Context()); err == nil {
		for _, a := range apps.List() {
			v.Apps = append(v.Apps, a.Name)
		}
	}
	if id := strings.TrimSpace(r.FormValue("q")); id != "" {
		s.dlqSearch(w, r, f, id)
		return
	}
	q, err := f.pageQuery(now)
	after, before := r.FormValue("after"), r.FormValue("before")
	switch {
	case err != nil:
		v.Problem = err.Error()
	case after != "" && !stream.IsID(after) || before != "" && !stream.IsID(before):
		v.Problem = "after, before: not a stream id"
	}
	if v.Problem != "" {
		w.WriteHeader(http.StatusBadRequest)
		s.renderPage(w, r, "dlq", page{Title: "Dead letters", Stream: st, Data: v})
		return
	}
	if err := s.dlqPage(r.Context(), &v, f, q, after, before, r.FormValue("last") != ""); err != nil {
		// The page itself, with the banner and the count unknown.
		v.Problem = "reading the dead-letter queue failed: " + clean(err.Error())
	}
	s.renderPage(w, r, "dlq", page{Title: "Dead letters", Stream: st, Data: v})
}

// dlqPage reads one page of the list into v: forward from after (or the
// start), or the page before before, or the last page; then the count.
func (s *Server) dlqPage(ctx context.Context, v *dlqView, f dlqFilter, q dlq.PageQuery, after, before string, last bool) error {
	store := redisdlq.NewStore(s.redis(ctx), f.Stream)
	backward := before != "" || last
	if backward {
		// The page before is the next one in the other order, turned round.
		q.Newest, q.After = !q.Newest, before
	} else {
		q.After = after
	}
	p, err := store.Page(ctx, q)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, bad := range p.Undecodable {
		id, _ := dlq.IsUndecodable(bad)
		v.Rows = append(v.Rows, dlqRow{Entry: dlq.Entry{ID: id}, Problem: bad.Error()})
	}
	for _, e := range p.Entries {
		row := s.dlqRow(e, now)
		if x, ok := findExcerpt(e.Event, f.Text); ok {
			row.Excerpt = &x
		}
		v.Rows = append(v.Rows, row)
	}
	// Undecodable entries were listed first: put every row in order.
	slices.SortStableFunc(v.Rows, func(a, b dlqRow) int {
		if q.Newest {
			return stream.CompareID(b.ID, a.ID)
		}
		return stream.CompareID(a.ID, b.ID)
	})
	if backward {
		slices.Reverse(v.Rows)
	}
	v.Scanned = p.Scanned
	v.Short = p.Next != "" && len(p.Entries) < q.Count
	if v.Short {
		v.ShortAt = p.Next
	}
	if len(v.Rows) > 0 {
		firstID, lastID := v.Rows[0].ID, v.Rows[len(v.Rows)-1].ID
		if !backward && p.Next != "" || backward && !last {
			v.Next = f.URL("after", lastID)
		}
		if after != "" || backward && p.Next != "" {
			v.Prev = f.URL("before", firstID)
		}
		v.First = after != "" || backward
		if !last && (v.Next != "") {
			v.Last = f.URL("last", "1")
		}
	}
	return s.dlqCount(ctx, store, v, q)
}

// dlqCount counts what the filter selects: the queue's length without
// one, else at most searchWindow entries read.
func (s *Server) dlqCount(ctx context.Context, store *redisdlq.Store, v *dlqView, q dlq.PageQuery) error {
	total, err := store.Len(ctx)
	if err != nil {
		return err
	}
	v.Total = total
	if !q.Filtered() {
		v.Matching, v.Counted = total, true
		return nil
	}
	q.Newest = true
	n, complete, err := store.Count(ctx, q, searchWindow)
	if err != nil {
		return err
	}
	v.Matching, v.AtLeast, v.Counted = int64(n), !complete, true
	return nil
}

// dlqSearch jumps to the entry whose id, or whose original message id,
// is id; the original id is looked for among the newest searchWindow
// entries.
func (s *Server) dlqSearch(w http.ResponseWriter, r *http.Request, f dlqFilter, id string) {
	if !stream.IsID(id) {
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("search: %q is not a message id (such as 1718000000000-0); "+
			"to search the events' text, use the payload filter", clean(id)))
		return
	}
	ctx := r.Context()
	store := redisdlq.NewStore(s.redis(ctx), f.Stream)
	to := func(entry string) {
		http.Redirect(w, r, query("/dlq/entry", "stream", f.Stream, "id", entry, "back", f.URL()), http.StatusSeeOther)
	}
	switch _, err := store.Get(ctx, id); {
	case err == nil || errors.Is(err, dlq.ErrInvalidEntry):
		to(id)
		return
	case !errors.Is(err, dlq.ErrNotFound):
		s.failRedis(w, r, err)
		return
	}
	var found string
	_, err := dlqScan(ctx, store, dlq.PageQuery{Newest: true, Scan: searchWindow}, func(e dlq.Entry) bool {
		if e.OriginalID == id {
			found = e.ID
			return false
		}
		return true
	})
	switch {
	case err != nil:
		s.failRedis(w, r, err)
	case found != "":
		to(found)
	default:
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("no dead-letter entry %s, and none for message %s among the newest %s entries of %s",
			id, id, thousands(searchWindow), store.Key()))
	}
}

// dlqScan calls each for the entries of q, in pages, until it returns
// false or q's Scan budget is spent; it returns how many were read.
func dlqScan(ctx context.Context, store *redisdlq.Store, q dlq.PageQuery, each func(dlq.Entry) bool) (int, error) {
	budget, read := q.Scan, 0
	q.Count = 500
	for read < budget {
		q.Scan = min(budget-read, 2000)
		p, err := store.Page(ctx, q)
		if err != nil {
			return read, err
		}
		read += p.Scanned
		for _, e := range p.Entries {
			if !each(e) {
				return read, nil
			}
		}
		if p.Next == "" {
			return read, nil
		}
		q.After = p.Next
	}
	return read, nil
}

// backTo is the list URL a form or link came from (?back=), kept only
// when it is the dead-letter list of this console.
func backTo(r *http.Request, st string) string {
	if b := localPath(r.FormValue("back")); strings.HasPrefix(b, "/dlq?") {
		if u, err := url.Parse(b); err == nil && u.Query().Get("stream") == st {
			return b
		}
	}
	return query("/dlq", "stream", st)
}
