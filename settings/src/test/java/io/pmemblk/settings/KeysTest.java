package io.pmemblk.settings;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.List;

import org.junit.jupiter.api.Test;

import static org.assertj.core.api.Assertions.assertThat;

class KeysTest {
    /** A key declared past its group (Key.of directly) would be missing from the example file and from loading. */
    @Test
    void everyDeclaredKeyIsInAll() throws Exception {
        List<String> declared = new ArrayList<>();
        for (Field f : Keys.class.getDeclaredFields()) {
            if (f.getType() == Key.class && Modifier.isStatic(f.getModifiers()) && Modifier.isPublic(f.getModifiers())) {
                declared.add(((Key<?>) f.get(null)).name());
            }
        }
        assertThat(declared).isNotEmpty();
        assertThat(Keys.ALL.keySet()).containsExactlyInAnyOrderElementsOf(declared);
    }
}
