package console

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// maxResults is how many replay and remove results the console keeps for
// their result pages, newest; resultTTL how long.
const (
	maxResults = 200
	resultTTL  = time.Hour
)

// results keeps the outcome of each replay and remove, in memory, so the
// POST redirects to a page that shows it (POST-redirect-GET): reloading
// that page shows the outcome again and never acts again.
type results struct {
	mu    sync.Mutex
	m     map[string]storedResult
	order []string // ids, oldest first
}

type storedResult struct {
	at time.Time
	v  resultView
}

func newResults() *results { return &results{m: map[string]storedResult{}} }

// put keeps v and returns its id.
func (rs *results) put(v resultView, now time.Time) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for len(rs.order) > 0 && (len(rs.order) >= maxResults || now.Sub(rs.m[rs.order[0]].at) > resultTTL) {
		delete(rs.m, rs.order[0])
		rs.order = rs.order[1:]
	}
	rs.m[id] = storedResult{at: now, v: v}
	rs.order = append(rs.order, id)
	return id
}

// get returns the result with id, if it is still kept.
func (rs *results) get(id string, now time.Time) (resultView, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[id]
	if !ok || now.Sub(r.at) > resultTTL {
		return resultView{}, false
	}
	return r.v, true
}
