// Package docs holds the user documentation. Its test keeps the citations
// in the repository's Go files true: every docs/<page>.md#<anchor> a
// comment cites must exist.
package docs

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	citation = regexp.MustCompile(`docs/([a-z0-9_-]+\.md)(#[a-z0-9_-]+)?`)
	heading  = regexp.MustCompile("^#{1,6} +(.+)$")
	unwanted = regexp.MustCompile("[^a-z0-9 _-]")
)

// anchors returns the heading anchors of a Markdown page, as GitHub makes
// them: lower case, punctuation dropped, spaces as hyphens.
func anchors(t *testing.T, page string) map[string]bool {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	inCode := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil && !inCode {
			a := unwanted.ReplaceAllString(strings.ToLower(m[1]), "")
			out["#"+strings.ReplaceAll(a, " ", "-")] = true
		}
	}
	return out
}

func TestGoFilesCiteExistingDocs(t *testing.T) {
	pages := map[string]map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasSuffix(path, "citations_test.go") {
				break
			}
			for _, m := range citation.FindAllStringSubmatch(line, -1) {
				page, anchor := m[1], m[2]
				if pages[page] == nil {
					if _, err := os.Stat(page); err != nil {
						t.Errorf("%s:%d cites docs/%s, which does not exist", path, i+1, page)
						pages[page] = map[string]bool{}
						continue
					}
					pages[page] = anchors(t, page)
				}
				if anchor != "" && !pages[page][anchor] {
					t.Errorf("%s:%d cites docs/%s%s: no such heading", path, i+1, page, anchor)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
