// Package docs holds the user documentation. Its tests keep the citations
// in the repository true: every docs/<page>.md#<anchor> a Go file cites
// must exist, and nothing cites a document that is not in the repository.
package docs

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	citation = regexp.MustCompile(`docs/([a-z0-9_-]+\.md)(#[a-z0-9_-]+)?`)
	heading  = regexp.MustCompile("^#{1,6} +(.+)$")
	unwanted = regexp.MustCompile("[^a-z0-9 _-]")

	// external matches a citation of a document users of the repository
	// never see: the contract documents the project was built from, and
	// issue numbers of a tracker. Comments and docs cite docs/ instead.
	external = regexp.MustCompile(`\b(events|reference|DESIGN|STYLE)\.md\b|\bSTYLE §|\b[Ii]ssue #[0-9]+`)
)

// checkedExtensions are the files that carry comments or prose a user of
// the repository reads: Go, Lua, Python and JavaScript sources, scripts,
// Markdown, and the deployment files.
var checkedExtensions = []string{".go", ".md", ".lua", ".sh", ".py", ".cjs", ".mjs", ".js", ".yaml", ".yml", ".json", ".env", ".service"}

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

// eachLine calls fn for every line of every file of the repository (the
// parent of this directory) that keep accepts, skipping hidden directories
// and this file, whose patterns would match themselves. path is relative
// to the repository root; line is 1-based.
func eachLine(t *testing.T, keep func(path string) bool, fn func(path string, line int, text string)) {
	t.Helper()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel("..", path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() || rel == "docs/citations_test.go" || !keep(rel) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, text := range strings.Split(string(src), "\n") {
			fn(rel, i+1, text)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGoFilesCiteExistingDocs(t *testing.T) {
	pages := map[string]map[string]bool{}
	isGo := func(path string) bool { return strings.HasSuffix(path, ".go") }
	eachLine(t, isGo, func(path string, line int, text string) {
		for _, m := range citation.FindAllStringSubmatch(text, -1) {
			page, anchor := m[1], m[2]
			if pages[page] == nil {
				if _, err := os.Stat(page); err != nil {
					t.Errorf("%s:%d cites docs/%s, which does not exist", path, line, page)
					pages[page] = map[string]bool{}
					continue
				}
				pages[page] = anchors(t, page)
			}
			if anchor != "" && !pages[page][anchor] {
				t.Errorf("%s:%d cites docs/%s%s: no such heading", path, line, page, anchor)
			}
		}
	})
}

// TestNothingCitesDocumentsOutsideTheRepository: a comment or a page that
// sends its reader to one of the contract documents the project was built
// from (the names external matches) or to an issue number sends them
// nowhere; cite docs/<page>.md#<anchor>, and write the sentence into docs/
// when it is not there yet.
func TestNothingCitesDocumentsOutsideTheRepository(t *testing.T) {
	checked := func(path string) bool {
		return slices.Contains(checkedExtensions, filepath.Ext(path)) || filepath.Base(path) == "Makefile"
	}
	eachLine(t, checked, func(path string, line int, text string) {
		if m := external.FindString(text); m != "" {
			t.Errorf("%s:%d cites %q, which is not in the repository: cite docs/<page>.md#<anchor> instead", path, line, m)
		}
	})
}

// architectureFile matches a file or directory the architecture page
// names: a backticked path that ends in .go or .lua, or a package
// directory of the module.
var architectureFile = regexp.MustCompile("`([a-z0-9_./-]+\\.(?:go|lua))`")

// TestArchitectureNamesFilesThatExist: every file docs/architecture.md
// names (the stage table, the supervisor's loops, the scripts) and every
// package of its diagram exists, so the page a new contributor reads first
// stays true as files move.
func TestArchitectureNamesFilesThatExist(t *testing.T) {
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	names := 0
	for _, m := range architectureFile.FindAllStringSubmatch(string(b), -1) {
		names++
		if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
			t.Errorf("architecture.md names %s: %v", m[1], err)
		}
	}
	// In the diagram a package is what starts a line or follows an arrow,
	// and the names listed after it on the line ("stream, invocation,").
	inCode := false
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			continue
		}
		for _, pkg := range diagramPackages(line) {
			names++
			dir := filepath.Join("..", pkg)
			if pkg == "relay" {
				dir = ".." // the root
			}
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				t.Errorf("architecture.md's diagram names package %s, which is not a directory of the module", pkg)
			}
		}
	}
	if names < 10 {
		t.Errorf("architecture.md names %d files and packages; the check no longer finds them", names)
	}
}

// diagramPackage matches the package names at the start of a line of the
// architecture diagram or after an arrow: lower-case paths, separated by
// commas, before the description.
var diagramPackage = regexp.MustCompile(`^(?:[│├└ ]{0,16}(?:──▶ )?)((?:[a-z]+(?:/[a-z]+)*)(?:, (?:[a-z]+(?:/[a-z]+)*))*,?)(?: |$)`)

// diagramPackages returns the packages one diagram line names.
func diagramPackages(line string) []string {
	m := diagramPackage.FindStringSubmatch(line)
	if m == nil {
		return nil
	}
	var out []string
	for p := range strings.SplitSeq(m[1], ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
