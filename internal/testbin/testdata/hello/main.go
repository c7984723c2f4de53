// Command hello prints hello: the binary testbin's test builds.
package main

import "fmt"

func main() { fmt.Println("hello") }
