package io.pmemblk.settings;

import java.util.function.Function;

/**
 * One setting: its name, its default (as text, exactly as a user would write it), what values are allowed,
 * and the parser that turns text into a value or explains why it cannot.
 */
public record Key<T>(String name, String defaultText, String allowed, String doc, Parser<T> parser) {
    @FunctionalInterface
    public interface Parser<T> {
        /** @return the value, or throws IllegalArgumentException with no message needed beyond "not allowed" */
        T parse(String text);
    }

    static <T> Key<T> of(String name, String defaultText, String allowed, String doc, Parser<T> parser) {
        return new Key<>(name, defaultText, allowed, doc, parser);
    }

    static <T> Parser<T> map(Parser<String> p, Function<String, T> f) {
        return t -> f.apply(p.parse(t));
    }
}
