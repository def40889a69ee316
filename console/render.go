package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/reltime"
	"github.com/relaydev/relay/internal/textsafe"
	"github.com/relaydev/relay/stats"
)

// page is what the layout template gets: the page's own data is Data.
type page struct {
	Title    string
	Active   string // the nav entry to highlight
	CSRF     string
	Streams  []string
	Stream   string // the stream the page is about, "" when none
	Group    string
	Base     string // the list page of Active, for the stream switcher
	ReadOnly bool
	Replay   bool // a Runner is wired
	Auth     bool // a token is required, so a logout button makes sense
	// Visitor: a token is required and this request has none (the login
	// page): the layout shows no navigation, group or stream names.
	Visitor bool
	// Unreachable is the last connect error while the console has no
	// Redis client yet (Config.Connect), shown in a banner on every page.
	Unreachable string
	// Refresh reloads the page after this many seconds (a running job).
	Refresh int
	// Lost: the console had a client, and Redis stopped answering it.
	Lost bool
	Data any
}

var funcs = template.FuncMap{
	"text":      clean,
	"age":       age,
	"ago":       func(t time.Time) string { return ago(t, time.Now()) },
	"utc":       utc,
	"local":     func(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05 MST") },
	"short":     func(s string, n int) string { return oneLine(clean(s), n) },
	"pretty":    prettyEvent,
	"q":         query,
	"num":       func(n int64) string { return thousands(n) },
	"bytes":     stats.FormatBytes,
	"int64f":    func(f float64) int64 { return int64(f) },
	"inc":       func(i int) int { return i + 1 },
	"sub":       func(a, b int) int { return a - b },
	"perHour":   func(perSecond float64) float64 { return perSecond * 3600 },
	"plural":    plural.Of,
	"int64":     func(n int) int64 { return int64(n) },
	"has":       func(l []string, v string) bool { return slices.Contains(l, v) },
	"plural64":  func(n int64, noun string) string { return plural.Of(int(n), noun) },
	"rate":      func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"streamURL": streamURL,
	"since":     ago,
	"span": func(d time.Duration) string {
		if d > 0 && d < time.Second {
			return d.Round(time.Millisecond).String()
		}
		return age(d)
	},
	"dict2": func(v any, now time.Time) map[string]any { return map[string]any{"V": v, "Now": now} },
	"firstID": func(evs []feedEvent) string {
		if len(evs) == 0 {
			return ""
		}
		return evs[0].ID
	},
}

// parsePages parses layout.html with each other template of templates/.
func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/partials.html"))
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".html")
		if base == "layout" || base == "partials" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[base] = t
	}
	return out, nil
}

// render writes page name inside the layout. It renders into a buffer
// first, so a template error becomes a 500 rather than half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	s.renderPage(w, r, name, page{Title: title, Data: data})
}

func (s *Server) renderPage(w http.ResponseWriter, r *http.Request, name string, p page) {
	p.CSRF, _ = r.Context().Value(csrfKey{}).(string)
	p.Streams, p.Group = s.cfg.Streams, s.cfg.Group
	p.ReadOnly, p.Replay, p.Auth = s.cfg.ReadOnly, s.cfg.Runner != nil && !s.cfg.ReadOnly, s.cfg.Token != ""
	if p.Visitor = p.Auth && !s.authorized(r); p.Visitor {
		p.Streams, p.Group, p.Stream = nil, "", ""
	}
	// The login page names nothing of the console, Redis's address neither.
	if err := s.link.down(); err != nil && !p.Visitor {
		p.Unreachable = clean(err.Error())
	} else if err := s.link.unreachable(); err != nil && !p.Visitor {
		p.Unreachable, p.Lost = clean(err.Error()), true
	}
	if p.Active == "" {
		p.Active = name
	}
	p.Base = "/" + p.Active
	if p.Active == "overview" {
		p.Base = "/"
	}
	var buf bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		s.log.Error("console: rendering a page failed", "page", name, "error", err)
		http.Error(w, "rendering the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page with status code.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if code >= 500 {
		s.log.Warn("console: request failed", "path", r.URL.Path, "error", msg)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	s.render(w, r, "error", http.StatusText(code), msg)
}

// failRedis renders the error page for a Redis read a page cannot do
// without: 503, and the layout's banner when Redis is unreachable.
func (s *Server) failRedis(w http.ResponseWriter, r *http.Request, err error) {
	s.fail(w, r, http.StatusServiceUnavailable, "reading Redis failed: "+err.Error())
}

// stream returns the stream a request names (?stream=), the first one
// when it names none, and whether it is one of the console's.
func (s *Server) stream(r *http.Request) (string, bool) {
	name := r.FormValue("stream")
	if name == "" {
		return s.cfg.Streams[0], true
	}
	for _, st := range s.cfg.Streams {
		if st == name {
			return st, true
		}
	}
	return "", false
}

// clean makes s safe to display: event payloads, reasons and handler
// output may hold any bytes, and the page is declared UTF-8. Bytes that are
// not UTF-8 become U+FFFD; control characters other than newline and tab,
// and bidirectional controls (U+202E turns the rest of a line around), are
// escaped as the CLI escapes them (textsafe.Escape), so stored text can
// neither disguise itself nor show as boxes.
func clean(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return textsafe.Escape(s, true)
}

// prettyEvent indents a JSON event, keeping its key order and numbers;
// anything else is shown as it is (malformed messages keep their bytes).
func prettyEvent(event string) string {
	if strings.TrimSpace(event) == "" {
		return "(empty)"
	}
	var buf bytes.Buffer
	if json.Indent(&buf, []byte(event), "", "  ") == nil {
		return clean(buf.String())
	}
	return clean(event)
}

// age is reltime.Age, the CLI's rendering, of d, and "0s" for a negative
// d: a page shows no time ago in the future.
func age(d time.Duration) string { return reltime.Age(max(d, 0)) }

// ago is "3m ago", or "in 3m" for a time after now.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if t.After(now) {
		return "in " + age(t.Sub(now))
	}
	return age(now.Sub(t)) + " ago"
}

func utc(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// thousands writes n with thin separators: 1 000 000.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u202f")
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// query builds a relative URL: path with the given key, value pairs,
// leaving out empty values. Values are escaped here; html/template then
// escapes the whole attribute.
func query(p string, kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Add(kv[i], kv[i+1])
		}
	}
	if len(v) == 0 {
		return p
	}
	return p + "?" + v.Encode()
}

// streamURL is the current page's path for another stream.
func streamURL(p, stream string) string { return query(p, "stream", stream) }

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
