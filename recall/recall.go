// Package recall serves the tools a model calls to see again an image
// imgctx did not send: imgctx_recall(handle), the image as MCP image
// content, and imgctx_list(handle), the removed images of the conversation
// that handle belongs to. A handle is what a marker says when recall is on
// (engine.RecallHandle); it resolves only within the tenant that asks.
//
// The server is the official MCP Go SDK's, over Streamable HTTP (Handler,
// mounted at /mcp by imgctx serve, stateless: every request is
// authenticated on its own) or stdio (imgctx mcp).
package recall

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ListTool is the name of the tool that lists a conversation's removed
// images.
const ListTool = "imgctx_list"

// RecallArgs are imgctx_recall's arguments.
type RecallArgs struct {
	Handle string `json:"handle" jsonschema:"the handle a marker names, as in imgctx_recall(\"i…\")"`
}

// ListArgs are imgctx_list's arguments.
type ListArgs struct {
	Handle string `json:"handle" jsonschema:"any handle of the conversation, from one of its markers"`
}

// Listed is one removed image in imgctx_list's answer.
type Listed struct {
	Handle    string    `json:"handle"`
	MediaType string    `json:"media_type,omitempty"`
	Caption   string    `json:"caption,omitempty"`
	Reason    string    `json:"reason"`
	Removed   time.Time `json:"removed"`
}

// ListResult is imgctx_list's structured answer.
type ListResult struct {
	Images []Listed `json:"images"`
}

var schemas = mcp.NewSchemaCache()

// NewServer returns an MCP server whose tools answer for the tenant.
func NewServer(e *engine.Engine, tenant, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "imgctx", Title: "imgctx image recall", Version: version},
		&mcp.ServerOptions{SchemaCache: schemas, Instructions: "When a message says [image removed … — recall with imgctx_recall(\"…\")], " +
			"call " + chat.RecallTool + " with that handle to see the image again."})
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: chat.RecallTool, Annotations: readOnly,
		Description: "Show again an image of this conversation that was removed from the context. " +
			"Pass the handle its marker names: [image removed … — recall with " + chat.RecallTool + "(\"i…\")]."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a RecallArgs) (*mcp.CallToolResult, any, error) {
			r, err := e.Recall(ctx, tenant, a.Handle)
			if err != nil {
				return nil, nil, err
			}
			about := fmt.Sprintf("Image %s (removed: %s)", r.Handle, r.Reason)
			if r.Caption != "" {
				about += " — " + r.Caption
			}
			if r.Shrunk {
				about += "; shrunk to the model's limits"
			}
			return &mcp.CallToolResult{Content: []mcp.Content{
				&mcp.TextContent{Text: about},
				&mcp.ImageContent{Data: r.Data, MIMEType: r.MediaType},
			}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: ListTool, Annotations: readOnly,
		Description: "List the images removed from this conversation's context (handle, caption, when, why), " +
			"newest first, to choose one to " + chat.RecallTool + ". Pass any handle of the conversation."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a ListArgs) (*mcp.CallToolResult, ListResult, error) {
			rs, err := e.Recalls(ctx, tenant, a.Handle)
			if err != nil {
				return nil, ListResult{}, err
			}
			out := ListResult{Images: make([]Listed, 0, len(rs))}
			var b strings.Builder
			for _, r := range rs {
				out.Images = append(out.Images, Listed{Handle: r.Handle, MediaType: r.MediaType, Caption: r.Caption, Reason: string(r.Reason), Removed: r.Removed})
				fmt.Fprintf(&b, "%s  %s  %s", r.Handle, r.Removed.Format(time.RFC3339), r.Reason)
				if r.Caption != "" {
					b.WriteString("  " + r.Caption)
				}
				b.WriteByte('\n')
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
		})
	return s
}

type tenantKey struct{}

// WithTenant names the authenticated tenant of an MCP request.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// Handler serves MCP over Streamable HTTP, statelessly: each request is
// answered for the tenant its context names (WithTenant), so no session
// id another caller could present outlives the request.
func Handler(e *engine.Engine, version string) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		tenant, _ := r.Context().Value(tenantKey{}).(string)
		if tenant == "" {
			return nil // not authenticated: the SDK answers 400
		}
		return NewServer(e, tenant, version)
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
}
