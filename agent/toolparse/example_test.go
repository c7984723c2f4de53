package toolparse_test

import (
	"fmt"

	"github.com/rollbox/rollbox/agent/toolparse"
)

func ExampleParseHermes() {
	text := "Let me run the tests.\n" +
		"<tool_call>\n{\"name\": \"run_tests\", \"arguments\": {}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"bash\", \"arguments\": \"{\\\"command\\\": \\\"ls\\\"}\"}\n</tool_call>"
	content, calls, err := toolparse.ParseHermes(text)
	fmt.Printf("%q %v\n", content, err)
	for _, c := range calls {
		fmt.Println(c.Name, c.Arguments)
	}

	content, calls, err = toolparse.ParseHermes(`<tool_call>{"name": "bash", "arguments": {</tool_call>`)
	fmt.Printf("%q %d\n%v\n", content, len(calls), err)
	// Output:
	// "Let me run the tests." <nil>
	// run_tests {}
	// bash {"command": "ls"}
	// "<tool_call>{\"name\": \"bash\", \"arguments\": {</tool_call>" 0
	// malformed tool-call markup: block 1 at byte 0: body is not a JSON object: unexpected end of JSON input
}
