//! A valid component of another world: it exports a greeting, not a Sluice processor.

wit_bindgen::generate!({
    inline: "
        package example:greeter@1.0.0;
        world greeter {
            export greet: func(name: string) -> string;
        }
    ",
});

struct Greeter;

impl Guest for Greeter {
    fn greet(name: String) -> String {
        format!("hello, {name}")
    }
}

export!(Greeter);
