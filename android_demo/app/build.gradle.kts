plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "org.edgespec.demo"
    compileSdk = 34

    defaultConfig {
        applicationId = "org.edgespec.demo"
        minSdk = 24
        targetSdk = 34
        versionCode = 1
        versionName = "0.1.0"
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    kotlinOptions {
        jvmTarget = "17"
    }
}

// No dependencies: the Activity uses the platform's widgets, and the bridge client
// (src/main/java/org/edgespec/bridge) is plain Java with its own small JSON reader.
