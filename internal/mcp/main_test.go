package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/hutch-dev/hutch/internal/backend/native"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.InitMain()
	}
	before := runtime.NumGoroutine()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		code = leakCheck(before)
	}
	os.Exit(code)
}

// leakCheck fails the run when goroutines outlive the tests: an in-process
// API call (Server.InProcess) or an MCP session left running would show
// here. Daemons and sessions end in the tests' cleanups.
func leakCheck(before int) int {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "%d goroutines left over (%d before the tests):\n%s\n", n, before, buf[:runtime.Stack(buf, true)])
		return 1
	}
	return 0
}

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// hutchBinary builds the real hutch binary once per test binary: the stdio
// tests run `hutch mcp` as an MCP client would.
func hutchBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "hutch-mcp-bin-"); buildErr != nil {
			return
		}
		// Sandboxes exec nothing from here, but serve's data directory
		// rule (ancestors o+x) is simplest to meet everywhere.
		_ = os.Chmod(binDir, 0o755)
		binPath = filepath.Join(binDir, "hutch")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/hutch-dev/hutch/cmd/hutch")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build hutch: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// toolSpec is testdata/tools.json: the exact input properties of every
// tool, shared with the TypeScript test.
type toolSpec struct {
	Required []string `json:"required"`
	Optional []string `json:"optional"`
}

func loadToolSpecs(t *testing.T) map[string]toolSpec {
	t.Helper()
	b, err := os.ReadFile("testdata/tools.json")
	if err != nil {
		t.Fatal(err)
	}
	var specs map[string]toolSpec
	if err := json.Unmarshal(b, &specs); err != nil {
		t.Fatal(err)
	}
	return specs
}

// checkTools compares the listed tools' input schemas with the spec: the
// same tools, each an object with exactly the spec's properties, each
// described, the required ones required, and nothing else accepted.
func checkTools(t *testing.T, ctx context.Context, cs *mcp.ClientSession) {
	t.Helper()
	specs := loadToolSpecs(t)
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tool := range res.Tools {
		seen[tool.Name] = true
		spec, ok := specs[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %s", tool.Name)
			continue
		}
		if tool.Description == "" {
			t.Errorf("%s: no description", tool.Name)
		}
		var schema struct {
			Type                 string                     `json:"type"`
			Required             []string                   `json:"required"`
			Properties           map[string]json.RawMessage `json:"properties"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
		}
		raw, _ := json.Marshal(tool.InputSchema)
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatalf("%s: schema %s: %v", tool.Name, raw, err)
		}
		if schema.Type != "object" || schema.AdditionalProperties == nil || *schema.AdditionalProperties {
			t.Errorf("%s: want a closed object schema, got %s", tool.Name, raw)
		}
		if !sameSet(schema.Required, spec.Required) {
			t.Errorf("%s: required %v, want %v", tool.Name, schema.Required, spec.Required)
		}
		var props []string
		for name, p := range schema.Properties {
			props = append(props, name)
			var d struct {
				Description string `json:"description"`
			}
			if json.Unmarshal(p, &d); d.Description == "" {
				t.Errorf("%s.%s: no description", tool.Name, name)
			}
		}
		if want := append(slices.Clone(spec.Required), spec.Optional...); !sameSet(props, want) {
			t.Errorf("%s: properties %v, want %v", tool.Name, props, want)
		}
		if tool.OutputSchema == nil {
			t.Errorf("%s: no output schema", tool.Name)
		}
	}
	for name := range specs {
		if !seen[name] {
			t.Errorf("tool %s is missing", name)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// bearer adds an API key to every request.
type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}
