package hutch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	hutch "github.com/hutch-dev/hutch/sdk"
)

func ExampleFromEnv() {
	c, err := hutch.FromEnv() // HUTCH_HOST (default: the local daemon's socket), HUTCH_API_KEY
	if err != nil {
		log.Fatal(err)
	}
	h, err := c.Health(context.Background())
	if errors.Is(err, hutch.ErrUnavailable) {
		log.Fatal("no daemon: start one with hutch serve")
	}
	fmt.Println(h.Version)
}

func ExampleNew() {
	// Over TCP, with a key made by `hutch keys create`.
	c, err := hutch.New("http://127.0.0.1:7070", os.Getenv("HUTCH_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	_ = c
}

func ExampleClient_Create() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb, err := c.Create(ctx, hutch.CreateOptions{
		Env:     map[string]string{"LANG": "C.UTF-8"},
		Limits:  hutch.Limits{MemoryMiB: 512, CPUMillis: 1000},
		Labels:  map[string]string{"agent": "demo"},
		Timeout: 30 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Delete(context.Background())
	res, err := sb.Exec(ctx, "uname -a")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", res.Code(), res.Stdout)
}

func ExampleClient_All() {
	c, _ := hutch.FromEnv()
	for sb, err := range c.All(context.Background(), hutch.ListOptions{Labels: map[string]string{"agent": "demo"}}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(sb.ID, sb.State)
	}
}

func ExampleSandbox_Exec() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb := c.Sandbox("my-sandbox")
	res, err := sb.Exec(ctx, "python3 -", hutch.WithStdin([]byte("print(6*7)")),
		hutch.WithTimeout(10*time.Second), hutch.WithCwd("/workspace"))
	if err != nil {
		log.Fatal(err) // the request failed; a failing command is a result
	}
	if res.TimedOut {
		log.Fatal("too slow")
	}
	fmt.Printf("%s", res.Stdout)
}

func ExampleSandbox_ExecStream() {
	c, _ := hutch.FromEnv()
	st, err := c.Sandbox("my-sandbox").ExecStream(context.Background(), "make test",
		hutch.StreamHandler{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		log.Fatal(err)
	}
	os.Exit(st.Code())
}

func ExampleSandbox_ExecInteractive() {
	c, _ := hutch.FromEnv()
	s, err := c.Sandbox("my-sandbox").ExecInteractive(context.Background(), "sort")
	if err != nil {
		log.Fatal(err)
	}
	_, _ = io.WriteString(s, "b\na\n")
	_ = s.CloseStdin()
	out, _ := io.ReadAll(s.Stdout())
	st, err := s.Wait()
	fmt.Printf("%s%v %v\n", out, st.Code(), err)
}

func ExampleSandbox_StartProcess() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb := c.Sandbox("my-sandbox")
	p, err := sb.StartProcess(ctx, "python3 -m http.server 8000", hutch.ProcessOptions{Tag: "web"})
	if err != nil {
		log.Fatal(err)
	}
	// Later, maybe from another client: its output so far, then the rest live.
	_, _ = sb.ProcessOutput(ctx, "web", 0, true, hutch.StreamHandler{Stdout: os.Stdout, Stderr: os.Stderr})
	_ = sb.Signal(ctx, p.ID, "TERM")
}

func ExampleSandbox_AttachTerminal() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb := c.Sandbox("my-sandbox")
	p, err := sb.OpenTerminal(ctx, hutch.TerminalOptions{Rows: 24, Cols: 80})
	if err != nil {
		log.Fatal(err)
	}
	term, err := sb.AttachTerminal(ctx, p.ID, -1)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _, _ = io.Copy(term, os.Stdin) }()
	_, _ = io.Copy(os.Stdout, term) // until the shell exits
	if st := term.Exit(); st != nil {
		os.Exit(st.Code())
	}
}

func ExampleSandbox_ReadFileIfExists() {
	ctx := context.Background()
	c, _ := hutch.FromEnv()
	sb := c.Sandbox("my-sandbox")
	data, ok, err := sb.ReadFileIfExists(ctx, "notes.txt")
	switch {
	case err != nil:
		log.Fatal(err)
	case !ok:
		data = []byte("(no notes yet)")
	}
	fmt.Printf("%s\n", data)
	if err := sb.WriteFile(ctx, "notes.txt", append(data, "\nmore"...), 0o644); err != nil {
		log.Fatal(err)
	}
}

func ExampleError() {
	c, _ := hutch.FromEnv()
	_, err := c.Get(context.Background(), "gone")
	var he *hutch.Error
	if errors.As(err, &he) {
		fmt.Println(he.Status, he.Code, he.RequestID)
	}
	if errors.Is(err, hutch.ErrNotFound) {
		fmt.Println("no such sandbox")
	}
}
