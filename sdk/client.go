package hutch

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/hutch-dev/hutch/api"
)

// Client talks to one hutch daemon. It is safe for concurrent use.
type Client struct {
	host string // as given, for messages
	base string // the API's base URL, ending in /v1/
	key  string
	http *http.Client
	api  *api.ClientWithResponses
	ua   string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient uses hc for every request. For a unix host its transport
// must dial the socket itself; New's own client does.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.ua = ua } }

// DefaultHost is the daemon's socket in the default data directory:
// $HUTCH_DATA/hutch.sock, or ./.hutch/hutch.sock.
func DefaultHost() string {
	if d := os.Getenv("HUTCH_DATA"); d != "" {
		return "unix://" + filepath.Join(d, "hutch.sock")
	}
	return "unix://./.hutch/hutch.sock"
}

// FromEnv makes a client from HUTCH_HOST (default DefaultHost()) and
// HUTCH_API_KEY.
func FromEnv(opts ...Option) (*Client, error) {
	host := os.Getenv("HUTCH_HOST")
	if host == "" {
		host = DefaultHost()
	}
	return New(host, os.Getenv("HUTCH_API_KEY"), opts...)
}

// New makes a client for the daemon at host: unix:///path/to/hutch.sock, a
// bare socket path, or http(s)://host:port. apiKey, when not empty, is sent
// as a bearer token (the daemon requires one on TCP, not on its socket).
func New(host, apiKey string, opts ...Option) (*Client, error) {
	c := &Client{host: host, key: apiKey, ua: "hutch-go-sdk"}
	transport, base, err := parseHost(host)
	if err != nil {
		return nil, err
	}
	c.base = base
	c.http = &http.Client{Transport: transport}
	for _, o := range opts {
		o(c)
	}
	c.api, err = api.NewClientWithResponses(c.base, api.WithHTTPClient(c.http),
		api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			c.authorize(r.Header)
			return nil
		}))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Host returns the host the client was made for.
func (c *Client) Host() string { return c.host }

func (c *Client) authorize(h http.Header) {
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	if c.ua != "" {
		h.Set("User-Agent", c.ua)
	}
}

// parseHost returns the transport and API base URL for a host.
func parseHost(host string) (http.RoundTripper, string, error) {
	switch {
	case strings.HasPrefix(host, "unix://"):
		return unixTransport(strings.TrimPrefix(host, "unix://")), "http://hutch/v1/", nil
	case strings.HasPrefix(host, "/"), strings.HasPrefix(host, "./"):
		return unixTransport(host), "http://hutch/v1/", nil
	case strings.HasPrefix(host, "http://"), strings.HasPrefix(host, "https://"):
		base := strings.TrimSuffix(host, "/")
		if !strings.HasSuffix(base, "/v1") {
			base += "/v1"
		}
		return http.DefaultTransport.(*http.Transport).Clone(), base + "/", nil
	}
	return nil, "", &Error{Code: "invalid_argument",
		Message: "host " + host + ": want unix:///path/to/hutch.sock or http(s)://host:port: invalid argument"}
}

func unixTransport(path string) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	return t
}

// Health is the daemon's liveness answer.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
	Backend string `json:"backend"`
}

// Health asks whether the daemon is up, and which version it runs.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	r, err := c.api.HealthWithResponse(ctx)
	if err := c.check(r, err); err != nil {
		return nil, err
	}
	h, err := must(r.JSON200)
	if err != nil {
		return nil, err
	}
	return &Health{Status: h.Status, Version: h.Version, Backend: h.Backend}, nil
}

// response is what every generated *Response has.
type response interface {
	StatusCode() int
	GetBody() []byte
}

// check turns a generated call's outcome into nil or an error.
func (c *Client) check(r response, err error) error {
	if err != nil {
		return c.transportErr(err)
	}
	if sc := r.StatusCode(); sc >= 200 && sc < 300 {
		return nil
	}
	return errorFromBody(r.StatusCode(), r.GetBody(), nil)
}

// checkHTTP is check for a raw response, whose body it closes on error.
func (c *Client) checkHTTP(resp *http.Response, err error) error {
	if err != nil {
		return c.transportErr(err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return errorFromBody(resp.StatusCode, body, resp.Header)
}

// must returns a decoded 2xx body, or an error when there was none.
func must[T any](v *T) (*T, error) {
	if v == nil {
		return nil, protocolError("no JSON body")
	}
	return v, nil
}
