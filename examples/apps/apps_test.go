// Tests that the example apps load and that their handlers behave as the
// README says, through the Process runner and, when a containerd is
// available (see internal/containerdtest), the containerd runner.
package apps_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/depstest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

type demoCase struct {
	event        string
	app, handler string
	wantOut      string // substring of the forwarded output
	wantCode     int    // 0: success
	wantTimeout  bool
}

var demo = []demoCase{
	{
		event: `{"event_name":"INSERT","table_name":"users","new_image":{"id":7,"email":"ada@example.com"}}`,
		app:   "users", handler: "events.created",
		wantOut: "[users/events.created] welcome user ada@example.com (message 1-0, attempt 1)\n",
	},
	{
		event: `{"event_name":"DELETE","table_name":"users","old_image":{"id":7}}`,
		app:   "users", handler: "events.deleted",
		wantOut: "[users/events.deleted] goodbye user 7\n",
	},
	{
		event: `{"event_name":"INSERT","table_name":"invoices","new_image":{"id":"inv_1","amount":20}}`,
		app:   "billing", handler: "invoices.charge",
		wantOut: "[billing/invoices.charge] billing: payment provider unreachable", wantCode: 3,
	},
	{
		event: `{"event_name":"DELETE","table_name":"invoices","old_image":{"id":"inv_1"}}`,
		app:   "billing", handler: "invoices.refund",
		wantOut: "[billing/invoices.refund] billing: refund rejected on attempt 1", wantCode: 3,
	},
	{
		event: `{"event_name":"INSERT","table_name":"invoice_mails","new_image":{"invoice":"inv_1"}}`,
		app:   "billing", handler: "invoices.notify",
		wantOut: "[billing/invoices.notify] billing: mail relay busy (demo failure)", wantCode: 75,
	},
	{
		event: `{"event_name":"UPDATE","table_name":"invoices","new_image":{"id":"inv_2","amount":5000}}`,
		app:   "billing", handler: "invoices.reconcile",
		wantOut: "reconciling a large invoice", wantTimeout: true,
	},
	{
		event: `{"event_name":"INSERT","table_name":"orders","new_image":{"id":1001,"items":3,"total":59.9}}`,
		app:   "orders", handler: "handlers.orders.placed",
		wantOut: "[orders/handlers.orders.placed] order 1001 placed: 3 items, 59.90 EUR\n",
	},
	{
		event: `{"event_name":"UPDATE","table_name":"orders","new_image":{"id":1001,"status":"SHIPPED","carrier":"DHL"}}`,
		app:   "orders", handler: "handlers.orders.shipped",
		wantOut: "[orders/handlers.orders.shipped] order 1001 shipped with DHL\n",
	},
	{
		event: `{"event_name":"INSERT","table_name":"products","new_image":{"id":"sku-1","name":"Desk lamp"}}`,
		app:   "products", handler: "index.indexed",
		wantOut: "[products/index.indexed] product sku-1 indexed: \"Desk lamp\"\n",
	},
	{
		event: `{"event_name":"DELETE","table_name":"products","old_image":{"id":"sku-1"}}`,
		app:   "products", handler: "cache.invalidate",
		wantOut: "[products/cache.invalidate] cache of product sku-1 invalidated after DELETE\n",
	},
	{
		event: `{"event_name":"UPDATE","table_name":"stock","new_image":{"sku":"sku-1","quantity":2,"restock_in":"2 days"}}`,
		app:   "inventory", handler: "stock.low",
		wantOut: "[inventory/stock.low] stock of sku-1 is low (2 left): restock in 2 days (172800000 ms)\n",
	},
	{
		event: `{"event_name":"INSERT","table_name":"signups","new_image":{"email":"ada@example.com"}}`,
		app:   "notify", handler: "mail.send",
		wantOut: "[notify/mail.send] welcome mail to ada@example.com sent, SMTP login with a 14-byte password (sha256 " + demoSecretSum + "...)\n",
	},
	{
		event: `{"event_name":"INSERT","table_name":"payments","new_image":{"id":"pay_1","customer_id":"c-42","amount":30}}`,
		app:   "ledger", handler: "payments.capture",
		wantOut: "[ledger/payments.capture] captured payment pay_1 of customer c-42: 30 EUR (message 1-0)\n",
	},
	{
		event: `{"event_name":"UPDATE","table_name":"customers","new_image":{"id":"c-42","name":"Ada"}}`,
		app:   "ledger", handler: "search.reindex",
		wantOut: "[ledger/search.reindex] search entry of customer c-42 rebuilt: Ada\n",
	},
}

// demoSecret is the notify app's smtp-password in the tests; the output
// shows only its length and the start of its SHA-256.
const (
	demoSecret    = "demo-s3cr3t-pw\n"
	demoSecretSum = "6b33ea1d"
)

// runtimeImages are the images of the example runtime apps, built by
// scripts/runtime-images.sh; the env variables name their archives.
var runtimeImages = map[string]struct{ ref, env string }{
	runtime.RuntimePython3: {containerdtest.PythonImage, containerdtest.EnvPythonArchive},
	runtime.RuntimeNode:    {containerdtest.NodeImage, containerdtest.EnvNodeArchive},
}

func loadApps(t *testing.T) *app.Set {
	t.Helper()
	apps, err := template.LoadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if errs := apps.Errors(); len(errs) > 0 {
		t.Fatalf("example templates are invalid:\n%v", errs)
	}
	for _, name := range []string{"users", "billing", "orders", "products", "inventory", "notify", "ledger"} {
		if apps.Get(name) == nil {
			t.Fatalf("app %s not loaded", name)
		}
	}
	return apps
}

func TestTemplates(t *testing.T) {
	apps := loadApps(t)
	m := apps.Matcher()
	for _, c := range demo {
		targets, err := m.Match([]byte(c.event))
		if err != nil {
			t.Fatal(err)
		}
		if len(targets) != 1 || targets[0].App != c.app || targets[0].Handler != c.handler {
			t.Errorf("%s matched %+v, want only %s/%s", c.event, targets, c.app, c.handler)
		}
	}
	for _, r := range apps.Get("billing").Rules {
		if r.Handler == "invoices.charge" && r.Retries != 0 {
			t.Errorf("invoices.charge retries = %d, want 0 (straight to the DLQ)", r.Retries)
		}
	}
	// The ledger app's flow control, as docs/flow-control.md describes it.
	ledger := apps.Get("ledger")
	want := []app.Limits{
		{Concurrency: 2, Scope: app.ScopeCluster, ConcurrencyKey: "new_image.customer_id",
			Rate: app.Rate{Count: 20, Per: time.Second}, RateBurst: 5, MaxAge: 15 * time.Minute},
		{Debounce: app.Debounce{Key: "new_image.id", Period: 5 * time.Second}, MaxAge: time.Hour},
	}
	for i, r := range ledger.Rules {
		if i < len(want) && r.Limits != want[i] {
			t.Errorf("ledger %s: Limits %s, want %s", r.Handler, r.Limits, want[i])
		}
	}
	if ledger.Concurrency != 4 || len(ledger.Rules) != len(want) {
		t.Errorf("ledger: concurrency %d, %d rules", ledger.Concurrency, len(ledger.Rules))
	}
	if key := app.KeyOf([]byte(demo[len(demo)-2].event), ledger.Rules[0].Limits.ConcurrencyKey); key != "c-42" {
		t.Errorf("the payment's concurrency key is %q, want c-42", key)
	}
	for rt, name := range map[string]string{runtime.RuntimePython3: "orders", runtime.RuntimeNode: "products"} {
		spec := apps.Get(name).Spec
		if spec.Runtime != rt || spec.Image != runtimeImages[rt].ref {
			t.Errorf("%s: runtime %q image %q, want %q with the offline image %s", name, spec.Runtime, spec.Image, rt, runtimeImages[rt].ref)
		}
	}
}

// TestHandlersProcess runs every handler locally; runtime apps need python3
// or node on the PATH and are skipped without them.
func TestHandlersProcess(t *testing.T) {
	var out bytes.Buffer
	p, err := runtime.NewProcess(runtime.WithOutput(&out, &out))
	if err != nil {
		t.Fatal(err)
	}
	apps := loadApps(t)
	runDemo(t, apps, p, &out, func(t *testing.T, a *app.App) {
		if a.Spec.Deps != nil || len(a.Spec.Secrets) > 0 {
			t.Skip("the process runner installs no dependencies and mounts no secrets")
		}
		rt := a.Spec.Runtime
		if _, err := exec.LookPath(rt); err != nil {
			t.Skipf("%s not installed (TestHandlersContainerd runs it in its image)", rt)
		}
	})
}

func TestHandlersContainerd(t *testing.T) {
	c := containerdtest.Client(t)
	var out bytes.Buffer
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "smtp-password"), []byte(demoSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := []containerd.Option{containerd.WithNamespace(c.DefaultNamespace()), containerd.WithOutput(&out, &out),
		containerd.WithPull(false), containerd.WithStateDir(t.TempDir()), containerd.WithSecretsDir(secrets)}
	if ca := depstest.CAFile(); ca != "" {
		opts = append(opts, containerd.WithBuildCAFile(ca))
	}
	r, err := containerd.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	imported := map[string]bool{}
	runDemo(t, loadApps(t), r, &out, func(t *testing.T, a *app.App) {
		rt := a.Spec.Runtime
		if !imported[rt] {
			containerdtest.ImportArchive(t, c, runtimeImages[rt].env, runtimeImages[rt].ref)
			imported[rt] = true
		}
	})
	// Closing removes the prepared containers and waits for the removals
	// left to the background.
	if err := r.Close(t.Context()); err != nil {
		t.Errorf("close the runner: %v", err)
	}
	containerdtest.AssertClean(t, c)
}

// runDemo runs every demo case through runner; prepare is called before a
// case of a runtime app with its runtime.
func runDemo(t *testing.T, apps *app.Set, runner relay.Runner, out *bytes.Buffer, prepare func(t *testing.T, a *app.App)) {
	for _, c := range demo {
		t.Run(c.app+"/"+c.handler, func(t *testing.T) {
			out.Reset()
			a := apps.Get(c.app)
			if a.Spec.Runtime != "" {
				prepare(t, a)
			}
			var rule app.Rule
			for _, r := range a.Rules {
				if r.Handler == c.handler {
					rule = r
				}
			}
			req := runtime.Request{
				App: c.app, Handler: c.handler, MessageID: "1-0", Attempt: 1,
				Event: []byte(c.event), Timeout: rule.Timeout, Spec: a.Spec,
			}
			_, err := runner.Run(t.Context(), req)
			ee, isExit := errors.AsType[*runtime.ExitError](err)
			switch {
			case c.wantTimeout:
				if !isExit || !ee.TimedOut {
					t.Errorf("got %v, want a timeout", err)
				}
			case c.wantCode != 0:
				if !isExit || ee.Code != c.wantCode {
					t.Errorf("got %v, want exit code %d", err, c.wantCode)
				}
			case err != nil:
				t.Errorf("got %v, want success", err)
			}
			if !strings.Contains(out.String(), c.wantOut) {
				t.Errorf("output lacks %q:\n%s", c.wantOut, out)
			}
		})
	}
}
